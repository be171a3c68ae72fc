//! Task typing and the expert: a planner over the native state for the six ALFWorld task types.
//!
//! The task is read from the goal formula (object / receptacle types, the required state
//! predicates, how many distinct objects). The expert then plans with full state knowledge:
//! put away whatever the agent holds that does not serve the goal, fetch a fitting object (open its
//! receptacle if needed), clean / heat / cool it, and place it (or, for the light task, take it
//! to a lamp and turn the lamp on). Every command is taken from the current admissible actions, so
//! the plan is always playable; it is simulated on a copy of the game until the goal holds.

use std::collections::BTreeSet;

use super::pddl::RawFormula;
use super::{AlfworldEnv, Formula, GameSpec, Term};
use crate::envs::TextEnv;

#[derive(Clone, Debug, Default)]
pub struct GoalInfo {
    /// Object type constant of the object to move / hold.
    pub obj_type: Option<String>,
    /// Receptacle type constant of the destination.
    pub recep_type: Option<String>,
    /// Object type constant of the lamp (light task).
    pub lamp_type: Option<String>,
    pub clean: bool,
    pub hot: bool,
    pub cool: bool,
    /// Distinct objects to place.
    pub count: usize,
}

fn collect(f: &RawFormula, out: &mut Vec<(String, Vec<String>)>) {
    match f {
        RawFormula::True => {}
        RawFormula::And(v) | RawFormula::Or(v) => v.iter().for_each(|x| collect(x, out)),
        RawFormula::Not(_) => {}
        RawFormula::Imply(_, b) => collect(b, out),
        RawFormula::Atom(p, a) => out.push((p.clone(), a.clone())),
        RawFormula::Exists(_, b) | RawFormula::Forall(_, b) => collect(b, out),
    }
}

pub fn goal_info(spec: &GameSpec) -> GoalInfo {
    let mut atoms = Vec::new();
    collect(&spec.goal_raw, &mut atoms);
    let mut g = GoalInfo::default();
    let type_of = |v: &str| {
        atoms
            .iter()
            .find(|(p, a)| p == "objecttype" && a.len() == 2 && a[0] == v)
            .map(|(_, a)| a[1].clone())
    };
    let mut placed: BTreeSet<String> = BTreeSet::new();
    for (p, a) in &atoms {
        match (p.as_str(), a.as_slice()) {
            ("receptacletype", [_, t]) => g.recep_type = Some(t.clone()),
            ("inreceptacle", [o, _]) => {
                placed.insert(o.clone());
            }
            ("isclean", _) => g.clean = true,
            ("ishot", _) => g.hot = true,
            ("iscool", _) => g.cool = true,
            ("istoggled", [o]) => g.lamp_type = type_of(o),
            ("holds", [_, o]) => g.obj_type = type_of(o),
            _ => {}
        }
    }
    if g.lamp_type.is_some() {
        g.count = 1;
        g.recep_type = None;
    } else {
        g.count = placed.len().max(1);
        g.obj_type = placed.iter().find_map(|o| type_of(o));
    }
    g
}

/// One of [`super::TASK_TYPES`] (or "unknown"), from the goal formula.
pub fn task_type_of(spec: &GameSpec) -> &'static str {
    let g = goal_info(spec);
    if g.lamp_type.is_some() {
        "look_at_obj_in_light"
    } else if g.obj_type.is_none() || g.recep_type.is_none() {
        "unknown"
    } else if g.count >= 2 {
        "pick_two_obj_and_place"
    } else if g.clean {
        "pick_clean_then_place_in_recep"
    } else if g.hot {
        "pick_heat_then_place_in_recep"
    } else if g.cool {
        "pick_cool_then_place_in_recep"
    } else {
        "pick_and_place_simple"
    }
}

struct Sim {
    env: AlfworldEnv,
    plan: Vec<String>,
}

impl Sim {
    fn spec(&self) -> &GameSpec {
        &self.env.spec
    }
    fn pid(&self, name: &str) -> Option<u32> {
        self.spec().pred(name)
    }
    fn facts_of(&self, pred: &str) -> Vec<Vec<u32>> {
        match self.pid(pred) {
            Some(p) => self.env.facts[p as usize].iter().cloned().collect(),
            None => Vec::new(),
        }
    }
    fn has(&self, pred: &str, args: &[u32]) -> bool {
        self.pid(pred)
            .is_some_and(|p| self.env.facts[p as usize].contains(args))
    }
    fn obj(&self, name: &str) -> Option<u32> {
        self.spec()
            .objects
            .binary_search_by(|o| o.as_str().cmp(name))
            .ok()
            .map(|i| i as u32)
    }
    fn held(&self) -> Option<u32> {
        self.facts_of("holds").first().map(|a| a[1])
    }
    fn second_of(&self, pred: &str, first: u32) -> Option<u32> {
        self.facts_of(pred).into_iter().find(|a| a[0] == first).map(|a| a[1])
    }
    fn agent_loc(&self) -> Option<u32> {
        self.second_of("atlocation", self.spec().agent?)
    }
    fn is_type(&self, pred: &str, o: u32, t: Option<u32>) -> bool {
        t.is_some_and(|t| self.has(pred, &[o, t]))
    }

    /// Plays the first admissible grounding of `action` whose named parameters match.
    fn act(&mut self, action: &str, want: &[(&str, u32)]) -> bool {
        let spec = self.env.spec.clone();
        let found = self.env.valid.iter().position(|(ai, args)| {
            let a = &spec.actions[*ai];
            a.name == action
                && want.iter().all(|(pn, o)| {
                    a.params
                        .iter()
                        .position(|(n, _, _)| n == pn)
                        .is_some_and(|i| args[i] == *o)
                })
        });
        match found {
            Some(i) => {
                let cmd = self.env.commands[i].to_string();
                self.env.step(&cmd);
                self.plan.push(cmd);
                true
            }
            None => false,
        }
    }

    fn go_to(&mut self, r: u32) -> bool {
        let loc = self.second_of("receptacleatlocation", r);
        if loc.is_some() && loc == self.agent_loc() {
            return true;
        }
        self.act("gotolocation", &[("r", r)])
    }

    fn open_if_needed(&mut self, r: u32) -> bool {
        if self.has("openable", &[r]) && !self.has("opened", &[r]) {
            return self.act("openobject", &[("r", r)]);
        }
        true
    }

    fn can_contain(&self, r: u32, o: u32) -> bool {
        let rt = self.second_of("receptacletype", r);
        let ot = self.second_of("objecttype", o);
        match (rt, ot) {
            (Some(rt), Some(ot)) => self.has("cancontain", &[rt, ot]),
            _ => false,
        }
    }

    /// Puts the held object `o` into some receptacle (one at the agent's location first).
    fn drop_held(&mut self, o: u32, avoid: Option<u32>) -> bool {
        let here = self.agent_loc();
        let mut cands: Vec<u32> = self
            .facts_of("receptacleatlocation")
            .into_iter()
            .map(|a| a[0])
            .filter(|&r| self.can_contain(r, o))
            .collect();
        cands.sort_by_key(|&r| {
            (
                Some(r) == avoid,
                self.second_of("receptacleatlocation", r) != here,
                self.has("openable", &[r]),
            )
        });
        for r in cands {
            if self.go_to(r) && self.open_if_needed(r) && self.act("putobject", &[("o", o), ("r", r)]) {
                return true;
            }
        }
        false
    }

    fn fetch(&mut self, o: u32) -> bool {
        let Some(r) = self.second_of("inreceptacle", o) else {
            return false;
        };
        self.go_to(r) && self.open_if_needed(r) && self.act("pickupobject", &[("o", o), ("r", r)])
    }
}

/// The action that makes `pred` true and the receptacle-type constants its precondition accepts
/// (e.g. `ishot` -> `heatobject` with a microwave), read from the domain.
fn appliance_for(spec: &GameSpec, pred: &str) -> Option<(String, Vec<u32>)> {
    let pid = spec.pred(pred)?;
    let rtype = spec.pred("receptacletype")?;
    fn consts(f: &Formula, rtype: u32, out: &mut Vec<u32>) {
        match f {
            Formula::And(v) | Formula::Or(v) => v.iter().for_each(|x| consts(x, rtype, out)),
            Formula::Atom(p, a) if *p == rtype && a.len() == 2 => {
                if let Term::Obj(c) = a[1] {
                    out.push(c);
                }
            }
            _ => {}
        }
    }
    for a in &spec.actions {
        if a.effects
            .iter()
            .any(|e| e.positive && e.pred == pid && e.condition.is_none())
        {
            let mut out = Vec::new();
            for (_, f) in &a.literals {
                consts(f, rtype, &mut out);
            }
            for f in &a.rest {
                consts(f, rtype, &mut out);
            }
            if !out.is_empty() {
                return Some((a.name.clone(), out));
            }
        }
    }
    None
}

pub fn plan(env: &AlfworldEnv) -> Option<Vec<String>> {
    let spec = env.spec.clone();
    let g = goal_info(&spec);
    let mut sim = Sim {
        env: env.clone(),
        plan: Vec::new(),
    };
    sim.env.max_steps = usize::MAX;
    sim.env.last = None;
    let ot = g.obj_type.as_deref().and_then(|t| sim.obj(t));
    let rt = g.recep_type.as_deref().and_then(|t| sim.obj(t));
    let lt = g.lamp_type.as_deref().and_then(|t| sim.obj(t));
    let need = |sim: &Sim, o: u32| -> Option<(String, Vec<u32>)> {
        for (on, pred) in [(g.clean, "isclean"), (g.hot, "ishot"), (g.cool, "iscool")] {
            if on && !sim.has(pred, &[o]) {
                return appliance_for(&spec, pred);
            }
        }
        None
    };
    let receps_of = |sim: &Sim, t: Option<u32>| -> Vec<u32> {
        sim.facts_of("receptacletype")
            .into_iter()
            .filter(|a| Some(a[1]) == t)
            .map(|a| a[0])
            .collect()
    };
    // Destination: for two objects, the receptacle already holding the most fitting ones.
    let dest: Option<u32> = {
        let mut rs = receps_of(&sim, rt);
        rs.sort_by_key(|&r| {
            let n = sim
                .facts_of("inreceptacle")
                .iter()
                .filter(|a| a[1] == r && sim.is_type("objecttype", a[0], ot))
                .count();
            (std::cmp::Reverse(n), sim.has("openable", &[r]))
        });
        rs.first().copied()
    };
    for _ in 0..80 {
        if sim.env.won() {
            return Some(sim.plan);
        }
        if sim.plan.len() > 200 {
            return None;
        }
        let held = sim.held();
        let fits = |sim: &Sim, o: u32| sim.is_type("objecttype", o, ot);
        match held {
            Some(o) if fits(&sim, o) && !(g.count >= 2 && dest.is_some() && sim.has("inreceptacle", &[o, dest?])) => {
                if let Some(lamp_t) = lt {
                    // Light task: take it to a lamp and switch the lamp on.
                    let lamps: Vec<(u32, u32)> = sim
                        .facts_of("inreceptacle")
                        .into_iter()
                        .filter(|a| sim.is_type("objecttype", a[0], Some(lamp_t)) && sim.has("toggleable", &[a[0]]))
                        .map(|a| (a[0], a[1]))
                        .collect();
                    let (lamp, r) = *lamps.first()?;
                    if !(sim.go_to(r) && sim.act("toggleobject", &[("o", lamp)])) {
                        return None;
                    }
                } else if let Some((action, appl_types)) = need(&sim, o) {
                    let appl: Vec<u32> = appl_types.iter().flat_map(|&t| receps_of(&sim, Some(t))).collect();
                    let r = *appl.first()?;
                    if !(sim.go_to(r) && sim.act(&action, &[("o", o), ("r", r)])) {
                        return None;
                    }
                } else {
                    let r = dest?;
                    if !(sim.go_to(r) && sim.open_if_needed(r) && sim.act("putobject", &[("o", o), ("r", r)])) {
                        return None;
                    }
                }
            }
            Some(o) => {
                if !sim.drop_held(o, dest) {
                    return None;
                }
            }
            None => {
                // Pick a fitting object that is not already where it belongs.
                let mut cands: Vec<u32> = sim
                    .facts_of("inreceptacle")
                    .into_iter()
                    .filter(|a| fits(&sim, a[0]) && (sim.pid("pickupable").is_none() || sim.has("pickupable", &[a[0]])))
                    .filter(|a| !(g.count >= 2 && Some(a[1]) == dest))
                    .map(|a| a[0])
                    .collect();
                // For one object: one already in a fitting receptacle that only lacks a state is fine.
                let here = sim.agent_loc();
                cands.sort_by_key(|&o| {
                    let r = sim.second_of("inreceptacle", o);
                    let loc = r.and_then(|r| sim.second_of("receptacleatlocation", r));
                    (loc != here, r.is_some_and(|r| sim.has("openable", &[r])))
                });
                let o = *cands.first()?;
                if !sim.fetch(o) {
                    return None;
                }
            }
        }
    }
    if sim.env.won() {
        Some(sim.plan)
    } else {
        None
    }
}

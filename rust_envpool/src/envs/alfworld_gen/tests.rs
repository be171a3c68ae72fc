use std::collections::{BTreeMap, BTreeSet, HashSet};

use proptest::prelude::*;

use super::vocab::{self, CLEAN, COOL, HEAT, PICK, TOGGLE};
use super::*;

fn cfg(room: Option<Room>, r: Option<usize>, d: Option<usize>) -> GenConfig {
    GenConfig {
        room,
        num_receptacles: r,
        num_distractors: d,
        ..GenConfig::default()
    }
}

/// A plain reference of the ALFRED domain's rules, played on the generated scene (not on the
/// PDDL text): checks each walkthrough command's preconditions and the task goal at the end.
struct Sim<'a> {
    g: &'a Game,
    at: usize,
    opened: HashSet<usize>,
    holding: Option<usize>,
    inside: BTreeMap<usize, usize>,
    clean: HashSet<usize>,
    hot: HashSet<usize>,
    cool: HashSet<usize>,
    toggled: HashSet<usize>,
}

impl<'a> Sim<'a> {
    fn new(g: &'a Game) -> Self {
        let inside = g
            .objects
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.receptacle.map(|r| (i, r)))
            .collect();
        Sim {
            g,
            at: g.agent_location,
            opened: HashSet::new(),
            holding: None,
            inside,
            clean: HashSet::new(),
            hot: HashSet::new(),
            cool: HashSet::new(),
            toggled: HashSet::new(),
        }
    }

    fn rec(&self, name: &str) -> Result<usize, String> {
        self.g
            .receptacles
            .iter()
            .position(|r| r.name == name)
            .ok_or(format!("no receptacle named {name:?}"))
    }

    fn obj(&self, name: &str) -> Result<usize, String> {
        self.g
            .objects
            .iter()
            .position(|o| o.name == name)
            .ok_or(format!("no object named {name:?}"))
    }

    fn here(&self, r: usize) -> Result<(), String> {
        if self.g.receptacles[r].location == self.at {
            Ok(())
        } else {
            Err(format!("not at {}", self.g.receptacles[r].name))
        }
    }

    fn reachable(&self, r: usize) -> Result<(), String> {
        self.here(r)?;
        if self.g.receptacles[r].openable && !self.opened.contains(&r) {
            return Err(format!("{} is closed", self.g.receptacles[r].name));
        }
        Ok(())
    }

    fn step(&mut self, cmd: &str) -> Result<(), String> {
        let split2 = |rest: &str, sep: &str| -> Result<(String, String), String> {
            rest.split_once(sep)
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or(format!("bad command {cmd:?}"))
        };
        if let Some(r) = cmd.strip_prefix("go to ") {
            let r = self.rec(r)?;
            self.at = self.g.receptacles[r].location;
        } else if let Some(r) = cmd.strip_prefix("open ") {
            let r = self.rec(r)?;
            self.here(r)?;
            if !self.g.receptacles[r].openable || !self.opened.insert(r) {
                return Err(format!("cannot open {r}"));
            }
        } else if let Some(rest) = cmd.strip_prefix("take ") {
            let (o, r) = split2(rest, " from ")?;
            let (o, r) = (self.obj(&o)?, self.rec(&r)?);
            self.reachable(r)?;
            if self.holding.is_some() || self.inside.get(&o) != Some(&r) || self.g.objects[o].flags & PICK == 0 {
                return Err(format!("cannot take {cmd:?}"));
            }
            self.inside.remove(&o);
            self.holding = Some(o);
        } else if let Some(rest) = cmd.strip_prefix("move ") {
            let (o, r) = split2(rest, " to ")?;
            let (o, r) = (self.obj(&o)?, self.rec(&r)?);
            self.reachable(r)?;
            if self.holding != Some(o) || !vocab::can_contain(self.g.receptacles[r].class, self.g.objects[o].class) {
                return Err(format!("cannot put {cmd:?}"));
            }
            self.holding = None;
            self.inside.insert(o, r);
        } else if let Some(o) = cmd.strip_prefix("use ") {
            let o = self.obj(o)?;
            let r = *self.inside.get(&o).ok_or("lamp not in a receptacle")?;
            self.here(r)?;
            if self.g.objects[o].flags & TOGGLE == 0 {
                return Err("not toggleable".into());
            }
            self.toggled.insert(o);
        } else {
            let (verb, rest) = split2(cmd, " ")?;
            let (o, r) = split2(&rest, " with ")?;
            let (o, r) = (self.obj(&o)?, self.rec(&r)?);
            self.here(r)?;
            let (class, bit) = match verb.as_str() {
                "clean" => ("SinkBasin", CLEAN),
                "heat" => ("Microwave", HEAT),
                "cool" => ("Fridge", COOL),
                _ => return Err(format!("unknown command {cmd:?}")),
            };
            if self.holding != Some(o) || self.g.receptacles[r].class != class || self.g.objects[o].flags & bit == 0 {
                return Err(format!("cannot {cmd:?}"));
            }
            match verb.as_str() {
                "clean" => {
                    self.clean.insert(o);
                }
                "heat" => {
                    self.hot.insert(o);
                    self.cool.remove(&o);
                }
                _ => {
                    self.cool.insert(o);
                    self.hot.remove(&o);
                }
            }
        }
        Ok(())
    }

    /// The goal formula of the task type, evaluated on the current state.
    fn won(&self) -> bool {
        let g = self.g;
        let is_target = |o: usize| g.objects[o].class == g.target_class;
        let in_goal = |o: &usize| {
            self.inside
                .get(o)
                .map(|&r| Some(g.receptacles[r].class) == g.goal_class)
                .unwrap_or(false)
        };
        let placed: Vec<usize> = (0..g.objects.len()).filter(|&o| is_target(o) && in_goal(&o)).collect();
        match g.task_type {
            TaskType::PickAndPlaceSimple => !placed.is_empty(),
            TaskType::PickCleanThenPlaceInRecep => placed.iter().any(|o| self.clean.contains(o)),
            TaskType::PickHeatThenPlaceInRecep => placed.iter().any(|o| self.hot.contains(o)),
            TaskType::PickCoolThenPlaceInRecep => placed.iter().any(|o| self.cool.contains(o)),
            TaskType::PickTwoObjAndPlace => {
                // two distinct targets in the same goal receptacle
                let mut per_rec: BTreeMap<usize, usize> = BTreeMap::new();
                for o in &placed {
                    *per_rec.entry(self.inside[o]).or_default() += 1;
                }
                per_rec.values().any(|&n| n >= 2)
            }
            TaskType::LookAtObjInLight => {
                let holds = self.holding.map(is_target).unwrap_or(false);
                let lamp_lit_here = self.toggled.iter().any(|&l| {
                    g.objects[l].class == "DeskLamp"
                        && self
                            .inside
                            .get(&l)
                            .map(|&r| g.receptacles[r].location == self.at)
                            .unwrap_or(false)
                });
                holds && lamp_lit_here
            }
        }
    }
}

/// Everything a generated game must satisfy.
fn check_game(task: TaskType, seed: u64, config: &GenConfig) -> Result<(), String> {
    let game = generate_game(task, seed, config).map_err(|e| e.to_string())?;
    let json = game.to_json();
    let v: serde_json::Value = serde_json::from_str(&json).map_err(|e| format!("bad JSON: {e}"))?;
    for key in ["pddl_domain", "grammar", "pddl_problem"] {
        if !v[key].is_string() {
            return Err(format!("missing {key}"));
        }
    }
    if v["solvable"] != serde_json::Value::Bool(true) {
        return Err("solvable is not true".into());
    }
    let problem = v["pddl_problem"].as_str().unwrap();
    let grammar = v["grammar"].as_str().unwrap();
    if !grammar.contains(&format!("\"rhs\": \"Your task is to: {}.\"", game.task)) {
        return Err("task sentence missing from the grammar".into());
    }
    // Goal classes exist in the scene and in the goal formula.
    let otype = format!("{}Type", game.target_class);
    if !problem.contains(&format!("(objectType ?o {otype})")) && !problem.contains(&format!("(objectType ?o1 {otype})"))
    {
        return Err("goal does not name the target class".into());
    }
    let n_targets = game.objects.iter().filter(|o| o.class == game.target_class).count();
    let need = if task == TaskType::PickTwoObjAndPlace { 2 } else { 1 };
    if n_targets < need {
        return Err(format!("only {n_targets} {otype} objects"));
    }
    match game.goal_class {
        Some(gc) => {
            if !game.receptacles.iter().any(|r| r.class == gc) {
                return Err(format!("no {gc} receptacle"));
            }
            if !problem.contains(&format!("(receptacleType ?r {gc}Type)")) {
                return Err("goal does not name the receptacle class".into());
            }
        }
        None => {
            if !game
                .objects
                .iter()
                .any(|o| o.class == "DeskLamp" && o.receptacle.is_some())
            {
                return Err("no desk lamp".into());
            }
        }
    }
    if let Some(app) = match task {
        TaskType::PickCleanThenPlaceInRecep => Some("SinkBasin"),
        TaskType::PickHeatThenPlaceInRecep => Some("Microwave"),
        TaskType::PickCoolThenPlaceInRecep => Some("Fridge"),
        _ => None,
    } {
        if !game.receptacles.iter().any(|r| r.class == app) {
            return Err(format!("no {app}"));
        }
    }
    // Every id is declared once and every name is unique.
    let mut ids = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (id, name) in game
        .objects
        .iter()
        .map(|o| (&o.id, &o.name))
        .chain(game.receptacles.iter().map(|r| (&r.id, &r.name)))
    {
        if !ids.insert(id.clone()) || !names.insert(name.clone()) {
            return Err(format!("duplicate id or name {id} / {name}"));
        }
        if problem.matches(&format!("        {id} - ")).count() != 1 {
            return Err(format!("{id} not declared exactly once"));
        }
    }
    let locs: BTreeSet<&String> = game.locations.iter().collect();
    if locs.len() != game.locations.len() {
        return Err("duplicate location".into());
    }
    // One receptacle per location, and the agent starts away from all of them.
    let rec_locs: BTreeSet<usize> = game.receptacles.iter().map(|r| r.location).collect();
    if rec_locs.len() != game.receptacles.len() || rec_locs.contains(&game.agent_location) {
        return Err("receptacle locations are not distinct".into());
    }
    // Knobs are honoured.
    if let Some(n) = config.num_receptacles {
        if game.receptacles.len() != n {
            return Err(format!("{} receptacles, asked {n}", game.receptacles.len()));
        }
    }
    if let Some(n) = config.num_distractors {
        if game.num_distractors != n {
            return Err(format!("{} distractors, asked {n}", game.num_distractors));
        }
    }
    if let Some(room) = config.room {
        if game.room != room {
            return Err("room not honoured".into());
        }
    }
    // The walkthrough names only existing things and wins; the goal does not hold at the start.
    let wt: Vec<String> = v["walkthrough"]
        .as_array()
        .ok_or("no walkthrough")?
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    if wt != game.walkthrough || wt.is_empty() {
        return Err("walkthrough mismatch".into());
    }
    let mut sim = Sim::new(&game);
    if sim.won() {
        return Err("goal holds at the start".into());
    }
    for c in &wt {
        sim.step(c).map_err(|e| format!("{c:?}: {e}"))?;
    }
    if !sim.won() {
        return Err(format!("walkthrough does not win: {wt:?}"));
    }
    Ok(())
}

#[test]
fn every_task_type_generates_in_every_allowed_room() {
    for task in TaskType::ALL {
        for &room in task.rooms() {
            for seed in 0..8 {
                check_game(task, seed, &cfg(Some(room), None, None))
                    .unwrap_or_else(|e| panic!("{task} {room} {seed}: {e}"));
            }
        }
    }
}

#[test]
fn generation_is_deterministic() {
    for task in TaskType::ALL {
        let c = cfg(None, None, Some(7));
        let a = generate(task, 42, &c).unwrap();
        assert_eq!(a, generate(task, 42, &c).unwrap(), "{task}");
        assert_ne!(
            a,
            generate(task, 43, &c).unwrap(),
            "{task}: seeds 42 and 43 gave the same game"
        );
    }
    // Different task types with the same seed are different games.
    let c = GenConfig::default();
    assert_ne!(
        generate(TaskType::PickAndPlaceSimple, 5, &c).unwrap(),
        generate(TaskType::PickTwoObjAndPlace, 5, &c).unwrap()
    );
}

#[test]
fn output_has_the_official_layout() {
    let json = generate(TaskType::PickHeatThenPlaceInRecep, 3, &GenConfig::default()).unwrap();
    assert!(json.starts_with("{\"pddl_domain\": \";; Specification in PDDL of the Alfred domain"));
    assert!(json.contains("\"solvable\": true, \"walkthrough\": [\"go to "));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["pddl_domain"].as_str().unwrap(), DOMAIN_PDDL);
    let p = v["pddl_problem"].as_str().unwrap();
    assert!(p.starts_with("\n(define (problem plan_pcsd_gen_pick_heat_then_place_in_recep_kitchen_3)\n(:domain alfred)\n(:objects\nagent1 - agent\nSaltShaker - object\n        HousePlant - object\n"));
    assert!(p.contains("        OttomanType - rtype\n\n\n        "));
    assert!(p.contains("(:init\n\n\n        (receptacleType "));
    assert!(p.contains("        (isHot ?o)\n"));
    assert!(p.ends_with("        )\n    )\n    "));
    // Paren balance of the whole problem.
    let depth = p.chars().try_fold(0i64, |d, c| {
        let d = d + (c == '(') as i64 - (c == ')') as i64;
        (d >= 0).then_some(d)
    });
    assert_eq!(depth, Some(0));
}

#[test]
fn knob_validation_names_the_knob_and_range() {
    let e = generate(
        TaskType::PickHeatThenPlaceInRecep,
        0,
        &cfg(Some(Room::Bedroom), None, None),
    )
    .unwrap_err();
    assert!(matches!(e, GenError::RoomNotAllowed { .. }));
    assert!(
        e.to_string().contains("room bedroom") && e.to_string().contains("kitchen"),
        "{e}"
    );

    let e = generate(
        TaskType::PickAndPlaceSimple,
        0,
        &cfg(Some(Room::Kitchen), Some(3), None),
    )
    .unwrap_err();
    let (lo, hi) = Room::Kitchen.receptacle_range();
    assert_eq!(
        e.to_string(),
        format!("num_receptacles=3 is out of range: expected {lo}..={hi} for room kitchen")
    );

    let e = generate(TaskType::PickAndPlaceSimple, 0, &cfg(None, Some(41), None)).unwrap_err();
    assert!(e.to_string().starts_with("num_receptacles=41 is out of range"), "{e}");

    let e = generate(
        TaskType::PickAndPlaceSimple,
        0,
        &cfg(None, None, Some(MAX_DISTRACTORS + 1)),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "num_distractors={} is out of range: expected 0..={MAX_DISTRACTORS}",
            MAX_DISTRACTORS + 1
        )
    );

    // Without a room, a small receptacle count restricts the choice to rooms where it fits.
    let (lo, _) = Room::LivingRoom.receptacle_range();
    for seed in 0..10 {
        let g = generate_game(TaskType::PickAndPlaceSimple, seed, &cfg(None, Some(lo), None)).unwrap();
        assert!(g.room.receptacle_range().0 <= lo);
        assert_eq!(g.receptacles.len(), lo);
    }

    assert!(matches!(
        "pick_and_place".parse::<TaskType>(),
        Err(GenError::UnknownTaskType(_))
    ));
    assert!("attic".parse::<Room>().unwrap_err().to_string().contains("attic"));
    assert_eq!("Living_Room".parse::<Room>().unwrap(), Room::LivingRoom);
    for t in TaskType::ALL {
        assert_eq!(t.as_str().parse::<TaskType>().unwrap(), t);
    }
}

#[test]
fn knob_extremes_generate() {
    for task in TaskType::ALL {
        for &room in task.rooms() {
            let (lo, hi) = room.receptacle_range();
            for (r, d) in [(lo, 0), (hi, MAX_DISTRACTORS), (lo, MAX_DISTRACTORS), (hi, 0)] {
                check_game(task, 11, &cfg(Some(room), Some(r), Some(d)))
                    .unwrap_or_else(|e| panic!("{task} {room} r={r} d={d}: {e}"));
            }
        }
    }
}

#[test]
fn names_match_the_receptacle_listing_order() {
    // Within a class the demangler gives the first id in sorted order the highest number.
    let g = generate_game(
        TaskType::PickAndPlaceSimple,
        9,
        &cfg(Some(Room::Kitchen), Some(30), None),
    )
    .unwrap();
    let mut cabinets: Vec<&ReceptacleInfo> = g.receptacles.iter().filter(|r| r.class == "Cabinet").collect();
    cabinets.sort_by_key(|r| r.id.to_ascii_lowercase());
    let n = cabinets.len();
    for (i, r) in cabinets.iter().enumerate() {
        assert_eq!(r.name, format!("cabinet {}", n - i));
    }
}

fn any_task() -> impl Strategy<Value = TaskType> {
    prop::sample::select(TaskType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]
    #[test]
    fn prop_generated_games_are_valid(
        task in any_task(),
        seed in any::<u64>(),
        room_pick in prop::option::of(0usize..4),
        receptacles in prop::option::of(0usize..48),
        distractors in prop::option::of(0usize..70),
    ) {
        let room = room_pick.map(|i| task.rooms()[i % task.rooms().len()]);
        let c = cfg(room, receptacles, distractors);
        match generate(task, seed, &c) {
            Ok(json) => {
                prop_assert!(serde_json::from_str::<serde_json::Value>(&json).is_ok());
                if let Err(e) = check_game(task, seed, &c) {
                    return Err(TestCaseError::fail(e));
                }
            }
            Err(e) => {
                // Only out-of-range knobs are rejected, and the message names the knob.
                let msg = e.to_string();
                prop_assert!(matches!(e, GenError::OutOfRange { .. }), "{}", msg);
                prop_assert!(msg.contains("num_receptacles") || msg.contains("num_distractors"), "{}", msg);
            }
        }
    }
}

#[test]
fn reference_simulator_rejects_broken_walkthroughs() {
    // The checker above must be able to fail: a truncated walkthrough does not win, and a
    // command naming a missing object or skipping a step is refused.
    for task in TaskType::ALL {
        let g = generate_game(task, 21, &GenConfig::default()).unwrap();
        let mut sim = Sim::new(&g);
        for c in &g.walkthrough[..g.walkthrough.len() - 1] {
            sim.step(c).unwrap();
        }
        assert!(!sim.won(), "{task}: won without the last command");
        let mut sim = Sim::new(&g);
        assert!(sim.step("take unicorn 1 from countertop 1").is_err());
        // Taking the target without going to its receptacle first fails.
        let take = g.walkthrough.iter().find(|c| c.starts_with("take ")).unwrap();
        assert!(Sim::new(&g).step(take).is_err(), "{task}: took from afar");
    }
}

#[test]
fn usual_place_knob() {
    // 0 (the default) leaves every game byte-identical; out of range is an error naming the knob
    for task in TaskType::ALL {
        let zero = GenConfig {
            usual_place: 0.0,
            ..GenConfig::default()
        };
        assert_eq!(
            generate(task, 9, &zero).unwrap(),
            generate(task, 9, &GenConfig::default()).unwrap()
        );
    }
    let bad = GenConfig {
        usual_place: 1.5,
        ..GenConfig::default()
    };
    assert!(generate(TaskType::PickAndPlaceSimple, 1, &bad)
        .unwrap_err()
        .to_string()
        .contains("usual_place=1.5"));
    // at 1 every task object with a usual place its room may use starts there; at 0 far fewer do
    let share = |p: f64| {
        let (mut at_home, mut with_home) = (0, 0);
        for seed in 0..300 {
            let c = GenConfig {
                usual_place: p,
                room: Some(Room::Bedroom),
                ..GenConfig::default()
            };
            let g = generate_game(TaskType::PickAndPlaceSimple, seed, &c).unwrap();
            let o = &g.objects[g.task_objects[0]];
            let Some(home) = vocab::usual_place(o.class) else {
                continue;
            };
            if g.goal_class == Some(home) || !vocab::room_spec(Room::Bedroom).slots.iter().any(|s| s.0 == home) {
                continue;
            }
            with_home += 1;
            at_home += (g.receptacles[o.receptacle.unwrap()].class == home) as usize;
        }
        (at_home, with_home)
    };
    let (a1, n1) = share(1.0);
    assert!(n1 > 100 && a1 == n1, "{a1}/{n1}");
    let (a0, n0) = share(0.0);
    assert!((a0 as f64) < 0.6 * n0 as f64, "{a0}/{n0}");
}

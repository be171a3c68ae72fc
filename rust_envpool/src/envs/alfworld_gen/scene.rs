//! Scene sampling: room layout, receptacles, objects, ids and locations, task and walkthrough.

use std::collections::{BTreeMap, HashSet};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::vocab::{self, ObjClass, CLEAN, COOL, HEAT, PICK};
use super::{GenConfig, Room, TaskType};

/// A receptacle of the generated scene.
#[derive(Debug, Clone)]
pub struct ReceptacleInfo {
    /// Receptacle class (`Cabinet`, `SinkBasin`, ...).
    pub class: &'static str,
    /// PDDL id in the official naming scheme (`Cabinet_bar__plus_00_dot_41_bar_...`).
    pub id: String,
    /// Name the ALFWorld demangler gives it (`cabinet 3`).
    pub name: String,
    pub openable: bool,
    /// Index into [`Game::locations`].
    pub location: usize,
    pub(crate) xyz: [i64; 3],
}

/// An object of the generated scene.
#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub class: &'static str,
    pub id: String,
    pub name: String,
    /// Affordance bits ([`vocab::PICK`], ...).
    pub flags: u8,
    /// Index into [`Game::receptacles`] of the receptacle it is in (`None`: fixed scenery).
    pub receptacle: Option<usize>,
    pub location: usize,
}

/// A generated game.
#[derive(Debug, Clone)]
pub struct Game {
    pub task_type: TaskType,
    pub seed: u64,
    pub room: Room,
    /// Task sentence (the text after "Your task is to: ", without the final period).
    pub task: String,
    pub receptacles: Vec<ReceptacleInfo>,
    pub objects: Vec<ObjectInfo>,
    /// Location ids; receptacle locations first, then scenery, the agent's start last.
    pub locations: Vec<String>,
    pub agent_location: usize,
    /// Target object class, goal receptacle class (`None` for look_at_obj_in_light).
    pub target_class: &'static str,
    pub goal_class: Option<&'static str>,
    /// Indices (into `objects`) of the task's own objects: the target(s), then the lamp if any.
    pub task_objects: Vec<usize>,
    pub num_distractors: usize,
    pub walkthrough: Vec<String>,
}

/// Coordinates are kept in hundredths of a metre.
fn coord(v: i64) -> String {
    if v == 0 {
        return "00_dot_00".to_string();
    }
    let sign = if v < 0 { "_minus_" } else { "_plus_" };
    let a = v.abs();
    format!("{sign}{:02}_dot_{:02}", a / 100, a % 100)
}

fn loc_int(v: i64) -> String {
    if v < 0 {
        format!("_minus_{}", -v)
    } else {
        v.to_string()
    }
}

fn object_id(class: &str, xyz: [i64; 3]) -> String {
    format!(
        "{class}_bar_{}_bar_{}_bar_{}",
        coord(xyz[0]),
        coord(xyz[1]),
        coord(xyz[2])
    )
}

fn receptacle_id(class: &str, xyz: [i64; 3]) -> String {
    match class {
        // Basins are named after their fixture, as in ALFRED: `Sink_bar_..._bar_SinkBasin`.
        "SinkBasin" => format!("{}_bar_SinkBasin", object_id("Sink", xyz)),
        "BathtubBasin" => format!("{}_bar_BathtubBasin", object_id("Bathtub", xyz)),
        _ => object_id(class, xyz),
    }
}

/// The name alfworld's `Demangler` gives every id: the class part lowercased (`+ "basin"` for
/// basins), numbered per name from the end of the sorted id list (the first sorted id gets the
/// highest number).
pub(crate) fn demangle_names(ids: &[&str]) -> BTreeMap<String, String> {
    let mut sorted: Vec<String> = ids.iter().map(|s| s.to_ascii_lowercase()).collect();
    sorted.sort();
    sorted.dedup();
    let base = |id: &str| -> Option<String> {
        let (name, _) = id.split_once("_bar_")?;
        let mut name = name.to_string();
        if id.contains("basin") {
            name.push_str("basin");
        }
        Some(name)
    };
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for id in &sorted {
        if let Some(b) = base(id) {
            *counts.entry(b).or_default() += 1;
        }
    }
    let mut out = BTreeMap::new();
    for id in &sorted {
        let name = match base(id) {
            Some(b) => {
                let n = counts.get_mut(&b).unwrap();
                let s = format!("{b} {n}");
                *n -= 1;
                s
            }
            None => format!("{id} "),
        };
        out.insert(id.clone(), name);
    }
    out
}

struct Builder {
    rng: ChaCha8Rng,
    ids: HashSet<String>,
    locs: HashSet<(i64, i64, i64, i64)>,
    locations: Vec<String>,
    half: (i64, i64),
}

const HORIZONS: [i64; 7] = [60, 45, 30, 15, 0, -15, -30];

impl Builder {
    fn uniform(&mut self, lo: i64, hi: i64) -> i64 {
        self.rng.gen_range(lo..=hi)
    }

    /// A fresh location id near grid point (gx, gz).
    fn new_location(&mut self, gx: i64, gz: i64) -> usize {
        for spread in 0.. {
            let x = gx + if spread == 0 { 0 } else { self.uniform(-spread, spread) };
            let z = gz + if spread == 0 { 0 } else { self.uniform(-spread, spread) };
            let rot = self.uniform(0, 3);
            let hor = HORIZONS[self.rng.gen_range(0..HORIZONS.len())];
            if self.locs.insert((x, z, rot, hor)) {
                let id = format!(
                    "loc_bar_{}_bar_{}_bar_{}_bar_{}",
                    loc_int(x),
                    loc_int(z),
                    loc_int(rot),
                    loc_int(hor)
                );
                self.locations.push(id);
                return self.locations.len() - 1;
            }
        }
        unreachable!()
    }

    /// A fresh position (hundredths of a metre) whose id is unused.
    fn fresh_xyz(
        &mut self,
        make: &dyn Fn(&mut Self) -> [i64; 3],
        id_of: &dyn Fn([i64; 3]) -> String,
    ) -> ([i64; 3], String) {
        loop {
            let xyz = make(self);
            let id = id_of(xyz);
            if self.ids.insert(id.clone()) {
                return (xyz, id);
            }
        }
    }

    fn add_receptacle(&mut self, class: &'static str) -> ReceptacleInfo {
        let rc = vocab::rec_class(class);
        let (hx, hz) = self.half;
        let (ylo, yhi) = ((rc.y.0 * 100.0) as i64, (rc.y.1 * 100.0) as i64);
        let (xyz, id) = self.fresh_xyz(
            &|b: &mut Self| [b.uniform(-hx, hx), b.uniform(ylo, yhi), b.uniform(-hz, hz)],
            &|xyz| receptacle_id(class, xyz),
        );
        let openable = rc.openable >= 1.0 || (rc.openable > 0.0 && self.rng.gen_bool(rc.openable));
        // The agent stands about half a metre in front of the receptacle (grid of 0.25 m).
        let location = self.new_location(xyz[0] * 4 / 100, xyz[2] * 4 / 100);
        ReceptacleInfo {
            class,
            id,
            name: String::new(),
            openable,
            location,
            xyz,
        }
    }

    fn add_object_in(&mut self, class: &'static str, flags: u8, rec: &ReceptacleInfo, rec_index: usize) -> ObjectInfo {
        let base = rec.xyz;
        let (xyz, id) = self.fresh_xyz(
            &|b: &mut Self| {
                [
                    base[0] + b.uniform(-40, 40),
                    base[1] + b.uniform(2, 30),
                    base[2] + b.uniform(-40, 40),
                ]
            },
            &|xyz| object_id(class, xyz),
        );
        let _ = xyz;
        ObjectInfo {
            class,
            id,
            name: String::new(),
            flags,
            receptacle: Some(rec_index),
            location: rec.location,
        }
    }

    fn add_scenery(&mut self, class: &'static str, near: Option<[i64; 3]>) -> ObjectInfo {
        let (hx, hz) = self.half;
        // A fixture shares its basin's position; anything else (or a taken id) gets a random spot.
        let (xyz, id) = match near.map(|p| (p, object_id(class, p))) {
            Some((p, id)) if self.ids.insert(id.clone()) => (p, id),
            _ => self.fresh_xyz(
                &|b: &mut Self| {
                    [
                        b.uniform(-hx - 40, hx + 40),
                        b.uniform(20, 250),
                        b.uniform(-hz - 40, hz + 40),
                    ]
                },
                &|xyz| object_id(class, xyz),
            ),
        };
        let location = self.new_location(xyz[0] * 4 / 100, xyz[2] * 4 / 100);
        ObjectInfo {
            class,
            id,
            name: String::new(),
            flags: 0,
            receptacle: None,
            location,
        }
    }
}

fn weighted<'a, T>(rng: &mut ChaCha8Rng, items: &'a [(T, u32)]) -> Option<&'a T> {
    let total: u32 = items.iter().map(|(_, w)| *w).sum();
    if total == 0 {
        return None;
    }
    let mut pick = rng.gen_range(0..total);
    for (item, w) in items {
        if pick < *w {
            return Some(item);
        }
        pick -= w;
    }
    None
}

fn task_flag(task: TaskType) -> u8 {
    match task {
        TaskType::PickCleanThenPlaceInRecep => CLEAN,
        TaskType::PickHeatThenPlaceInRecep => HEAT,
        TaskType::PickCoolThenPlaceInRecep => COOL,
        _ => PICK,
    }
}

/// The appliance a task uses; it is never the goal receptacle.
fn appliance(task: TaskType) -> Option<&'static str> {
    match task {
        TaskType::PickCleanThenPlaceInRecep => Some("SinkBasin"),
        TaskType::PickHeatThenPlaceInRecep => Some("Microwave"),
        TaskType::PickCoolThenPlaceInRecep => Some("Fridge"),
        _ => None,
    }
}

fn task_sentence(task: TaskType, obj: &str, recep: &str, variant: bool) -> String {
    match (task, variant) {
        (TaskType::PickAndPlaceSimple, false) => format!("put a {obj} in {recep}"),
        (TaskType::PickAndPlaceSimple, true) => format!("put some {obj} on {recep}"),
        (TaskType::LookAtObjInLight, false) => format!("look at {obj} under the {recep}"),
        (TaskType::LookAtObjInLight, true) => format!("examine the {obj} with the {recep}"),
        (TaskType::PickCleanThenPlaceInRecep, false) => format!("put a clean {obj} in {recep}"),
        (TaskType::PickCleanThenPlaceInRecep, true) => format!("clean some {obj} and put it in {recep}"),
        (TaskType::PickHeatThenPlaceInRecep, false) => format!("put a hot {obj} in {recep}"),
        (TaskType::PickHeatThenPlaceInRecep, true) => format!("heat some {obj} and put it in {recep}"),
        (TaskType::PickCoolThenPlaceInRecep, false) => format!("put a cool {obj} in {recep}"),
        (TaskType::PickCoolThenPlaceInRecep, true) => format!("cool some {obj} and put it in {recep}"),
        (TaskType::PickTwoObjAndPlace, false) => format!("put two {obj} in {recep}"),
        (TaskType::PickTwoObjAndPlace, true) => format!("find two {obj} and put them in {recep}"),
    }
}

/// A task choice: target class, goal receptacle class, source classes of the target(s), lamp host.
struct Plan {
    target: &'static ObjClass,
    goal: Option<&'static str>,
    sources: Vec<&'static str>,
    lamp_host: Option<&'static str>,
}

fn plan_task(rng: &mut ChaCha8Rng, task: TaskType, room: Room, usual_place: f64) -> Plan {
    let spec = vocab::room_spec(room);
    let room_classes: Vec<&'static str> = spec.slots.iter().map(|s| s.0).collect();
    let flag = task_flag(task);
    let app = appliance(task);
    let mut options: Vec<(&'static ObjClass, Option<&'static str>)> = Vec::new();
    for o in vocab::OBJECTS
        .iter()
        .filter(|o| o.rooms.contains(&room) && o.flags & flag != 0)
    {
        if task == TaskType::LookAtObjInLight {
            if room_classes.iter().any(|rc| vocab::can_contain(rc, o.name)) {
                options.push((o, None));
            }
            continue;
        }
        for &g in &room_classes {
            if Some(g) == app || !vocab::can_contain(g, o.name) {
                continue;
            }
            if room_classes.iter().any(|&s| s != g && vocab::can_contain(s, o.name)) {
                options.push((o, Some(g)));
            }
        }
    }
    let &(target, goal) = options.choose(rng).expect("every allowed room has a task option");
    let sources_ok: Vec<&'static str> = room_classes
        .iter()
        .copied()
        .filter(|&s| Some(s) != goal && vocab::can_contain(s, target.name))
        .collect();
    let n_targets = if task == TaskType::PickTwoObjAndPlace { 2 } else { 1 };
    // the usual place (if the room has it and it may serve as a source) with probability
    // `usual_place`; no draw at 0, so the default stream is unchanged
    let usual = vocab::usual_place(target.name).filter(|u| sources_ok.contains(u));
    let sources = (0..n_targets)
        .map(|_| match usual {
            Some(u) if usual_place > 0.0 && rng.gen_bool(usual_place) => u,
            _ => *sources_ok.choose(rng).unwrap(),
        })
        .collect();
    let lamp_host = if task == TaskType::LookAtObjInLight {
        let hosts: Vec<&'static str> = room_classes
            .iter()
            .copied()
            .filter(|c| vocab::can_host_lamp(c))
            .collect();
        Some(*hosts.choose(rng).expect("look rooms have lamp hosts"))
    } else {
        None
    };
    Plan {
        target,
        goal,
        sources,
        lamp_host,
    }
}

pub(crate) fn build(task: TaskType, seed: u64, rooms: &[Room], config: &GenConfig) -> Game {
    // One independent stream per (task type, seed).
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(task.index());
    let room = *rooms.choose(&mut rng).expect("validated non-empty");
    let spec = vocab::room_spec(room);
    let plan = plan_task(&mut rng, task, room, config.usual_place);

    // ---- receptacle counts
    let mut counts: BTreeMap<&'static str, usize> = spec.slots.iter().map(|s| (s.0, s.1)).collect();
    let mut need = |c: &'static str| {
        let e = counts.get_mut(c).expect("planned classes belong to the room");
        *e = (*e).max(1);
    };
    if let Some(g) = plan.goal {
        need(g);
    }
    for s in &plan.sources {
        need(s);
    }
    if let Some(h) = plan.lamp_host {
        need(h);
    }
    let min_total: usize = counts.values().sum();
    let target_total = match config.num_receptacles {
        Some(n) => n.max(min_total),
        None => {
            let (lo, hi) = spec.default_receptacles;
            rng.gen_range(lo..=hi).max(min_total)
        }
    };
    let mut total = min_total;
    while total < target_total {
        let slots: Vec<(&'static str, u32)> = spec
            .slots
            .iter()
            .filter(|s| counts[s.0] < s.2)
            .map(|s| (s.0, s.3))
            .collect();
        let Some(&c) = weighted(&mut rng, &slots) else { break };
        *counts.get_mut(c).unwrap() += 1;
        total += 1;
    }

    // ---- receptacles (class order of the room spec; shuffled ids come from positions)
    let half = (rng.gen_range(180..=380), rng.gen_range(180..=380));
    let mut b = Builder {
        rng,
        ids: HashSet::new(),
        locs: HashSet::new(),
        locations: Vec::new(),
        half,
    };
    let mut receptacles: Vec<ReceptacleInfo> = Vec::new();
    for (class, n) in &counts {
        for _ in 0..*n {
            let r = b.add_receptacle(class);
            receptacles.push(r);
        }
    }
    let of_class = |recs: &[ReceptacleInfo], c: &str| -> Vec<usize> {
        recs.iter()
            .enumerate()
            .filter(|(_, r)| r.class == c)
            .map(|(i, _)| i)
            .collect()
    };

    // ---- task objects
    let mut objects: Vec<ObjectInfo> = Vec::new();
    let mut task_objects = Vec::new();
    for src in &plan.sources {
        let choices = of_class(&receptacles, src);
        let ri = *choices.choose(&mut b.rng).unwrap();
        let o = b.add_object_in(plan.target.name, plan.target.flags, &receptacles[ri], ri);
        task_objects.push(objects.len());
        objects.push(o);
    }
    let wants_lamp = match (task, room) {
        (TaskType::LookAtObjInLight, _) => true,
        (_, Room::Bedroom | Room::LivingRoom) => b.rng.gen_bool(0.5),
        _ => false,
    };
    if wants_lamp {
        let hosts: Vec<usize> = match plan.lamp_host {
            Some(h) => of_class(&receptacles, h),
            None => receptacles
                .iter()
                .enumerate()
                .filter(|(_, r)| vocab::can_host_lamp(r.class))
                .map(|(i, _)| i)
                .collect(),
        };
        if let Some(&ri) = hosts.choose(&mut b.rng) {
            let lamp = vocab::DESK_LAMP;
            let o = b.add_object_in(lamp.name, lamp.flags, &receptacles[ri], ri);
            if task == TaskType::LookAtObjInLight {
                task_objects.push(objects.len());
            }
            objects.push(o);
        }
    }

    // ---- distractors: room objects in receptacles that may hold them; never a target-class
    // object in a goal-class receptacle (the goal must not hold at the start).
    let n_distractors = match config.num_distractors {
        Some(n) => n,
        None => {
            let (lo, hi) = spec.default_distractors;
            b.rng.gen_range(lo..=hi)
        }
    };
    let hosts_for = |recs: &[ReceptacleInfo], o: &ObjClass| -> Vec<usize> {
        recs.iter()
            .enumerate()
            .filter(|(_, r)| vocab::can_contain(r.class, o.name))
            .filter(|(_, r)| !(o.name == plan.target.name && Some(r.class) == plan.goal))
            .map(|(i, _)| i)
            .collect()
    };
    let placeable: Vec<&'static ObjClass> = vocab::OBJECTS
        .iter()
        .filter(|o| o.rooms.contains(&room) && !hosts_for(&receptacles, o).is_empty())
        .collect();
    let mut per_class: BTreeMap<&'static str, usize> = BTreeMap::new();
    for o in &objects {
        *per_class.entry(o.class).or_default() += 1;
    }
    // At most a handful of copies of a class, unless the knob asks for more objects than that.
    let max_per_class = 5usize.max(n_distractors.div_ceil(placeable.len().max(1)) + 2);
    let mut placed = 0;
    while placed < n_distractors {
        let open: Vec<&&'static ObjClass> = placeable
            .iter()
            .filter(|o| per_class.get(o.name).copied().unwrap_or(0) < max_per_class)
            .collect();
        let Some(&&o) = open.choose(&mut b.rng) else { break };
        let hosts = hosts_for(&receptacles, o);
        let ri = *hosts.choose(&mut b.rng).unwrap();
        let obj = b.add_object_in(o.name, o.flags, &receptacles[ri], ri);
        objects.push(obj);
        *per_class.entry(o.name).or_default() += 1;
        placed += 1;
    }

    // ---- scenery (fixtures of the basins, then room decor), each at its own spot
    let basins: Vec<(String, [i64; 3])> = receptacles
        .iter()
        .filter_map(|r| match r.class {
            "SinkBasin" => Some(("Sink".to_string(), r.xyz)),
            "BathtubBasin" => Some(("Bathtub".to_string(), r.xyz)),
            _ => None,
        })
        .collect();
    for (fixture, xyz) in basins {
        let class: &'static str = if fixture == "Sink" { "Sink" } else { "Bathtub" };
        objects.push(b.add_scenery(class, Some(xyz)));
    }
    for d in vocab::DECOR.iter().filter(|d| d.rooms.contains(&room)) {
        let n = if d.name == "LightSwitch" {
            1
        } else {
            b.rng.gen_range(0..=d.max)
        };
        for _ in 0..n {
            objects.push(b.add_scenery(d.name, None));
        }
    }
    let agent_location = {
        let (hx, hz) = b.half;
        let (gx, gz) = (b.uniform(-hx, hx) * 4 / 100, b.uniform(-hz, hz) * 4 / 100);
        b.new_location(gx, gz)
    };

    // ---- names, exactly as the reference demangler assigns them
    {
        let mut ids: Vec<&str> = receptacles.iter().map(|r| r.id.as_str()).collect();
        ids.extend(objects.iter().map(|o| o.id.as_str()));
        ids.extend(b.locations.iter().map(|s| s.as_str()));
        let names = demangle_names(&ids);
        for r in receptacles.iter_mut() {
            r.name = names[&r.id.to_ascii_lowercase()].clone();
        }
        for o in objects.iter_mut() {
            o.name = names[&o.id.to_ascii_lowercase()].clone();
        }
    }

    // ---- goal receptacle instance, task sentence, walkthrough
    let goal_rec = plan
        .goal
        .map(|g| *of_class(&receptacles, g).choose(&mut b.rng).unwrap());
    let variant = b.rng.gen_bool(0.5);
    let target_word = plan.target.name.to_ascii_lowercase();
    let recep_word = match plan.goal {
        Some(g) => g.to_ascii_lowercase(),
        None => vocab::DESK_LAMP.name.to_ascii_lowercase(),
    };
    let task_text = task_sentence(task, &target_word, &recep_word, variant);

    let mut game = Game {
        task_type: task,
        seed,
        room,
        task: task_text,
        receptacles,
        objects,
        locations: b.locations,
        agent_location,
        target_class: plan.target.name,
        goal_class: plan.goal,
        task_objects,
        num_distractors: placed,
        walkthrough: Vec::new(),
    };
    game.walkthrough = walkthrough(&game, goal_rec);
    game
}

/// The command sequence that wins: fetch the target(s), use the appliance, deliver (or switch on
/// the lamp), opening closed receptacles on the way.
fn walkthrough(g: &Game, goal_rec: Option<usize>) -> Vec<String> {
    struct W<'a> {
        g: &'a Game,
        at: usize,
        opened: HashSet<usize>,
        cmds: Vec<String>,
    }
    impl W<'_> {
        fn go(&mut self, r: usize) {
            let rec = &self.g.receptacles[r];
            if self.at != rec.location {
                self.cmds.push(format!("go to {}", rec.name));
                self.at = rec.location;
            }
        }
        fn open(&mut self, r: usize) {
            let rec = &self.g.receptacles[r];
            if rec.openable && self.opened.insert(r) {
                self.cmds.push(format!("open {}", rec.name));
            }
        }
        fn take(&mut self, o: usize) {
            let obj = &self.g.objects[o];
            let r = obj.receptacle.expect("task objects are in receptacles");
            self.go(r);
            self.open(r);
            self.cmds
                .push(format!("take {} from {}", obj.name, self.g.receptacles[r].name));
        }
        fn put(&mut self, o: usize, r: usize) {
            self.go(r);
            self.open(r);
            self.cmds.push(format!(
                "move {} to {}",
                self.g.objects[o].name, self.g.receptacles[r].name
            ));
        }
        fn apply(&mut self, verb: &str, o: usize, class: &str) {
            let r = self
                .g
                .receptacles
                .iter()
                .position(|r| r.class == class)
                .expect("appliance present");
            self.go(r);
            self.cmds.push(format!(
                "{verb} {} with {}",
                self.g.objects[o].name, self.g.receptacles[r].name
            ));
        }
    }
    let mut w = W {
        g,
        at: g.agent_location,
        opened: HashSet::new(),
        cmds: Vec::new(),
    };
    let t0 = g.task_objects[0];
    match g.task_type {
        TaskType::LookAtObjInLight => {
            let lamp = g.task_objects[1];
            w.take(t0);
            w.go(g.objects[lamp].receptacle.unwrap());
            w.cmds.push(format!("use {}", g.objects[lamp].name));
        }
        TaskType::PickTwoObjAndPlace => {
            let r = goal_rec.unwrap();
            w.take(t0);
            w.put(t0, r);
            w.take(g.task_objects[1]);
            w.put(g.task_objects[1], r);
        }
        t => {
            let r = goal_rec.unwrap();
            w.take(t0);
            match t {
                TaskType::PickCleanThenPlaceInRecep => w.apply("clean", t0, "SinkBasin"),
                TaskType::PickHeatThenPlaceInRecep => w.apply("heat", t0, "Microwave"),
                TaskType::PickCoolThenPlaceInRecep => w.apply("cool", t0, "Fridge"),
                _ => {}
            }
            w.put(t0, r);
        }
    }
    w.cmds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_follow_the_official_scheme() {
        assert_eq!(coord(0), "00_dot_00");
        assert_eq!(coord(-47), "_minus_00_dot_47");
        assert_eq!(coord(115), "_plus_01_dot_15");
        assert_eq!(
            object_id("Apple", [-47, 115, 48]),
            "Apple_bar__minus_00_dot_47_bar__plus_01_dot_15_bar__plus_00_dot_48"
        );
        assert_eq!(
            receptacle_id("SinkBasin", [0, 89, -144]),
            "Sink_bar_00_dot_00_bar__plus_00_dot_89_bar__minus_01_dot_44_bar_SinkBasin"
        );
        assert_eq!(loc_int(-30), "_minus_30");
        assert_eq!(loc_int(4), "4");
    }

    #[test]
    fn demangler_numbers_from_the_end_of_the_sorted_ids() {
        let ids = [
            "Apple_bar__plus_00_dot_00_bar__plus_00_dot_98_bar__plus_00_dot_51",
            "Apple_bar__minus_00_dot_21_bar__plus_00_dot_98_bar__plus_00_dot_74",
            "Sink_bar_00_dot_00_bar__plus_00_dot_89_bar__minus_01_dot_44_bar_SinkBasin",
            "Sink_bar_00_dot_00_bar__plus_00_dot_89_bar__minus_01_dot_44",
            "agent1",
        ];
        let n = demangle_names(&ids);
        // sorted: "_m" < "_p", so the minus apple comes first and gets number 2.
        assert_eq!(
            n["apple_bar__minus_00_dot_21_bar__plus_00_dot_98_bar__plus_00_dot_74"],
            "apple 2"
        );
        assert_eq!(
            n["apple_bar__plus_00_dot_00_bar__plus_00_dot_98_bar__plus_00_dot_51"],
            "apple 1"
        );
        assert_eq!(
            n["sink_bar_00_dot_00_bar__plus_00_dot_89_bar__minus_01_dot_44_bar_sinkbasin"],
            "sinkbasin 1"
        );
        assert_eq!(
            n["sink_bar_00_dot_00_bar__plus_00_dot_89_bar__minus_01_dot_44"],
            "sink 1"
        );
        assert_eq!(n["agent1"], "agent1 ");
    }
}

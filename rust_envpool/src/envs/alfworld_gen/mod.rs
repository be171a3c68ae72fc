//! Procedural ALFWorld games: a seeded generator of new games of the six ALFWorld task types.
//!
//! [`generate`] returns the complete text of a `game.tw-pddl` file (JSON with `pddl_domain`,
//! `grammar`, `pddl_problem`, `solvable`, `walkthrough`), in the format of the official ALFWorld
//! 0.4.2 files, so that both the reference engine (textworld's PDDL env with alfworld's
//! demangler) and pcsd's native engine load and play it. The PDDL domain and the grammar are the
//! engine's rule text and are embedded (`assets/`); scenes (rooms, receptacles, objects, ids,
//! locations) are sampled from pcsd's own vocabulary tables ([`vocab`]).
//!
//! The same `(task_type, seed, config)` always yields byte-identical JSON (ChaCha8 stream seeded
//! from the task type and the seed, and only ordered containers).

mod emit;
mod scene;
pub mod vocab;

use std::fmt;
use std::str::FromStr;

pub use scene::{Game, ObjectInfo, ReceptacleInfo};

/// The PDDL domain shared by every ALFWorld game (the official `pddl_domain` text).
pub const DOMAIN_PDDL: &str = include_str!("assets/alfred_domain.pddl");
/// The grammar shared by every ALFWorld game, with `{{TASK}}` in place of the task sentence.
pub const GRAMMAR_TEMPLATE: &str = include_str!("assets/alfred_grammar.twl");

/// Largest number of receptacles a generated room may have.
pub const MAX_RECEPTACLES: usize = 40;
/// Largest number of distractor objects.
pub const MAX_DISTRACTORS: usize = 60;

/// The six ALFWorld task types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskType {
    PickAndPlaceSimple,
    LookAtObjInLight,
    PickCleanThenPlaceInRecep,
    PickHeatThenPlaceInRecep,
    PickCoolThenPlaceInRecep,
    PickTwoObjAndPlace,
}

impl TaskType {
    pub const ALL: [TaskType; 6] = [
        TaskType::PickAndPlaceSimple,
        TaskType::LookAtObjInLight,
        TaskType::PickCleanThenPlaceInRecep,
        TaskType::PickHeatThenPlaceInRecep,
        TaskType::PickCoolThenPlaceInRecep,
        TaskType::PickTwoObjAndPlace,
    ];

    /// ALFWorld's name of the task type (the task-folder prefix).
    pub fn as_str(self) -> &'static str {
        match self {
            TaskType::PickAndPlaceSimple => "pick_and_place_simple",
            TaskType::LookAtObjInLight => "look_at_obj_in_light",
            TaskType::PickCleanThenPlaceInRecep => "pick_clean_then_place_in_recep",
            TaskType::PickHeatThenPlaceInRecep => "pick_heat_then_place_in_recep",
            TaskType::PickCoolThenPlaceInRecep => "pick_cool_then_place_in_recep",
            TaskType::PickTwoObjAndPlace => "pick_two_obj_and_place",
        }
    }

    /// Rooms in which the task can be set (heating and cooling need a kitchen, cleaning a sink,
    /// looking under a lamp a room with desk lamps).
    pub fn rooms(self) -> &'static [Room] {
        use Room::*;
        match self {
            TaskType::PickAndPlaceSimple | TaskType::PickTwoObjAndPlace => &[Kitchen, LivingRoom, Bedroom, Bathroom],
            TaskType::LookAtObjInLight => &[LivingRoom, Bedroom],
            TaskType::PickCleanThenPlaceInRecep => &[Kitchen, Bathroom],
            TaskType::PickHeatThenPlaceInRecep | TaskType::PickCoolThenPlaceInRecep => &[Kitchen],
        }
    }

    pub(crate) fn index(self) -> u64 {
        TaskType::ALL.iter().position(|t| *t == self).unwrap() as u64
    }
}

impl fmt::Display for TaskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskType {
    type Err = GenError;
    fn from_str(s: &str) -> Result<Self, GenError> {
        TaskType::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| GenError::UnknownTaskType(s.to_string()))
    }
}

/// Room types of ALFRED scenes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Room {
    Kitchen,
    LivingRoom,
    Bedroom,
    Bathroom,
}

impl Room {
    pub const ALL: [Room; 4] = [Room::Kitchen, Room::LivingRoom, Room::Bedroom, Room::Bathroom];

    pub fn as_str(self) -> &'static str {
        match self {
            Room::Kitchen => "kitchen",
            Room::LivingRoom => "livingroom",
            Room::Bedroom => "bedroom",
            Room::Bathroom => "bathroom",
        }
    }

    /// Valid range of `num_receptacles` in this room: the room's required receptacles plus room
    /// for the task's own (goal, source, lamp host), up to [`MAX_RECEPTACLES`].
    pub fn receptacle_range(self) -> (usize, usize) {
        let spec = vocab::room_spec(self);
        let min: usize = spec.slots.iter().map(|s| s.1).sum::<usize>() + 3;
        (min, MAX_RECEPTACLES)
    }
}

impl fmt::Display for Room {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Room {
    type Err = GenError;
    /// Accepts `kitchen`, `livingroom` (also `living_room`, `living room`), `bedroom`, `bathroom`,
    /// case-insensitively.
    fn from_str(s: &str) -> Result<Self, GenError> {
        let k: String = s
            .to_ascii_lowercase()
            .chars()
            .filter(|c| !matches!(c, '_' | ' ' | '-'))
            .collect();
        Room::ALL
            .iter()
            .copied()
            .find(|r| r.as_str() == k)
            .ok_or_else(|| GenError::UnknownRoom(s.to_string()))
    }
}

/// Difficulty knobs. `None` lets the generator draw a value typical of the room.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenConfig {
    /// Room type; must be one of the task type's rooms ([`TaskType::rooms`]).
    pub room: Option<Room>,
    /// Total number of receptacles (within [`Room::receptacle_range`]).
    pub num_receptacles: Option<usize>,
    /// Number of objects besides the task's own objects (0..=[`MAX_DISTRACTORS`]).
    pub num_distractors: Option<usize>,
    /// Probability (0..=1) that a task object starts in its class's usual place
    /// ([`vocab::usual_place`]) when the room has one that may hold it; otherwise (and always at
    /// 0, the default) its receptacle class is drawn uniformly. 0 draws nothing extra from the
    /// game's random stream, so games are byte-identical to those without the knob.
    pub usual_place: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenError {
    #[error("unknown task_type {0:?}: expected one of pick_and_place_simple, look_at_obj_in_light, pick_clean_then_place_in_recep, pick_heat_then_place_in_recep, pick_cool_then_place_in_recep, pick_two_obj_and_place")]
    UnknownTaskType(String),
    #[error("unknown room {0:?}: expected one of kitchen, livingroom, bedroom, bathroom")]
    UnknownRoom(String),
    #[error("room {room} cannot host task_type {task}: expected one of {allowed}")]
    RoomNotAllowed {
        task: TaskType,
        room: Room,
        allowed: String,
    },
    #[error("{knob}={value} is out of range: expected {expected}")]
    OutOfRange {
        knob: &'static str,
        value: usize,
        expected: String,
    },
    #[error("usual_place={0} is out of range: expected a probability in [0, 1]")]
    UsualPlaceOutOfRange(String),
}

/// Generates one game and returns the text of its `game.tw-pddl` file.
pub fn generate(task_type: TaskType, seed: u64, config: &GenConfig) -> Result<String, GenError> {
    Ok(generate_game(task_type, seed, config)?.to_json())
}

/// Generates one game as a structured value (scene, walkthrough, task text) that can also be
/// rendered with [`Game::to_json`].
pub fn generate_game(task_type: TaskType, seed: u64, config: &GenConfig) -> Result<Game, GenError> {
    let room_choices = validate(task_type, config)?;
    Ok(scene::build(task_type, seed, &room_choices, config))
}

/// Checks the knobs and returns the rooms the game may be set in.
fn validate(task: TaskType, config: &GenConfig) -> Result<Vec<Room>, GenError> {
    let allowed = task.rooms();
    if !(0.0..=1.0).contains(&config.usual_place) {
        return Err(GenError::UsualPlaceOutOfRange(config.usual_place.to_string()));
    }
    if let Some(room) = config.room {
        if !allowed.contains(&room) {
            return Err(GenError::RoomNotAllowed {
                task,
                room,
                allowed: allowed.iter().map(|r| r.as_str()).collect::<Vec<_>>().join(", "),
            });
        }
    }
    if let Some(d) = config.num_distractors {
        if d > MAX_DISTRACTORS {
            return Err(GenError::OutOfRange {
                knob: "num_distractors",
                value: d,
                expected: format!("0..={MAX_DISTRACTORS}"),
            });
        }
    }
    let candidates: Vec<Room> = match config.room {
        Some(r) => vec![r],
        None => allowed.to_vec(),
    };
    let Some(n) = config.num_receptacles else {
        return Ok(candidates);
    };
    let fitting: Vec<Room> = candidates
        .iter()
        .copied()
        .filter(|r| {
            let (lo, hi) = r.receptacle_range();
            (lo..=hi).contains(&n)
        })
        .collect();
    if fitting.is_empty() {
        let expected = candidates
            .iter()
            .map(|r| {
                let (lo, hi) = r.receptacle_range();
                format!("{lo}..={hi} for room {r}")
            })
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(GenError::OutOfRange {
            knob: "num_receptacles",
            value: n,
            expected,
        });
    }
    Ok(fitting)
}

#[cfg(test)]
mod tests;

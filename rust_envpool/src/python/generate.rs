//! PyO3 wrappers of the procedural ALFWorld generator ([`crate::envs::alfworld_gen`]).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::envs::alfworld_gen::{self, GenConfig, GenError, Room, TaskType};

fn value_error(e: GenError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// generate_game_json(task_type, seed, room=None, receptacles=None, distractors=None, usual_place=0.0) -> str
///
/// The text of a new `game.tw-pddl` file. Raises ValueError naming the argument for an unknown
/// task type or room, or a knob out of range.
#[pyfunction]
#[pyo3(signature = (task_type, seed, room=None, receptacles=None, distractors=None, usual_place=0.0))]
fn generate_game_json(
    py: Python<'_>,
    task_type: &str,
    seed: u64,
    room: Option<&str>,
    receptacles: Option<usize>,
    distractors: Option<usize>,
    usual_place: f64,
) -> PyResult<String> {
    let task: TaskType = task_type.parse().map_err(value_error)?;
    let room: Option<Room> = room.map(str::parse).transpose().map_err(value_error)?;
    let config = GenConfig {
        room,
        num_receptacles: receptacles,
        num_distractors: distractors,
        usual_place,
    };
    py.detach(|| alfworld_gen::generate(task, seed, &config))
        .map_err(value_error)
}

/// The six task type names.
#[pyfunction]
fn gen_task_types() -> Vec<&'static str> {
    TaskType::ALL.iter().map(|t| t.as_str()).collect()
}

/// The generator's usual places: (object class, receptacle class) pairs.
#[pyfunction]
fn gen_usual_places() -> Vec<(&'static str, &'static str)> {
    alfworld_gen::vocab::USUAL_PLACES.to_vec()
}

/// The room names.
#[pyfunction]
fn gen_rooms() -> Vec<&'static str> {
    Room::ALL.iter().map(|r| r.as_str()).collect()
}

/// (min, max) of the `receptacles` knob for a room.
#[pyfunction]
fn gen_receptacle_range(room: &str) -> PyResult<(usize, usize)> {
    let room: Room = room.parse().map_err(value_error)?;
    Ok(room.receptacle_range())
}

/// The task type's allowed rooms.
#[pyfunction]
fn gen_task_rooms(task_type: &str) -> PyResult<Vec<&'static str>> {
    let task: TaskType = task_type.parse().map_err(value_error)?;
    Ok(task.rooms().iter().map(|r| r.as_str()).collect())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(generate_game_json, m)?)?;
    m.add_function(wrap_pyfunction!(gen_task_types, m)?)?;
    m.add_function(wrap_pyfunction!(gen_rooms, m)?)?;
    m.add_function(wrap_pyfunction!(gen_usual_places, m)?)?;
    m.add_function(wrap_pyfunction!(gen_receptacle_range, m)?)?;
    m.add_function(wrap_pyfunction!(gen_task_rooms, m)?)?;
    m.add("GEN_MAX_DISTRACTORS", alfworld_gen::MAX_DISTRACTORS)?;
    Ok(())
}

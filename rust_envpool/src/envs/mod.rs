//! The environments: the interface the pool steps ([`TextEnv`], [`EnvStep`]) and one module per
//! environment that implements it — [`alfworld`] (the native ALFWorld engine, byte-identical to
//! alfworld/TextWorld), [`alfworld_gen`] (the procedural ALFWorld game generator) and [`dummy`]
//! (a game that tests the pool machinery). An environment imports nothing from `pool`, `text` or
//! `python`; the pool knows environments only through [`TextEnv`].

pub mod alfworld;
pub mod alfworld_gen;
pub mod dummy;

/// What one reset or step returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvStep {
    /// Observation text, byte-identical to the reference engine's.
    pub obs: String,
    /// Admissible commands in the reference engine's order (sorted).
    pub admissible: Vec<String>,
    /// Score as the reference engine reports it (ALFWorld: 1.0 once won, else 0.0).
    pub score: f64,
    pub done: bool,
    pub won: bool,
}

/// A text game that can be reset and stepped with command strings.
pub trait TextEnv: Send {
    /// Starts the game over from its initial state.
    fn reset(&mut self) -> EnvStep;
    /// Applies one command. Unknown commands are not errors: the game answers as the reference
    /// engine does (ALFWorld: "Nothing happens.") and the step still counts.
    fn step(&mut self, command: &str) -> EnvStep;
    /// Task category (ALFWorld: one of the six task types).
    fn task_type(&self) -> &str;
    /// The task description shown to the agent (ALFWorld: the text after "Your task is to: ").
    fn task(&self) -> &str;
}

//! The environments: the interface the pool steps ([`TextEnv`], [`EnvStep`]) and one module per
//! environment that implements it — [`alfworld`] (the native ALFWorld engine, byte-identical to
//! alfworld/TextWorld), [`alfworld_gen`] (the procedural ALFWorld game generator) and [`dummy`]
//! (a game that tests the pool machinery), [`webshop`] (the native WebShop text environment,
//! byte-identical to princeton-nlp/WebShop on its recorded episodes). An environment imports nothing from `pool`, `text` or
//! `python`; the pool knows environments only through [`TextEnv`].

pub mod alfworld;
pub mod alfworld_gen;
pub mod dummy;
pub mod webshop;

/// What one reset or step returns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvStep {
    /// Observation text, byte-identical to the reference engine's.
    pub obs: String,
    /// Admissible commands in the reference engine's order (ALFWorld: sorted; WebShop: the
    /// page's clickables in the original's order).
    pub admissible: Vec<String>,
    /// Score as the reference engine reports it (ALFWorld: 1.0 once won, else 0.0; WebShop: the
    /// purchase reward in [0, 1] on the `buy now` step, else 0.0).
    pub score: f64,
    pub done: bool,
    pub won: bool,
    /// WebShop: the page has the search bar (`search[...]` is offered); false for ALFWorld.
    pub has_search_bar: bool,
}

/// A text game that can be reset and stepped with command strings.
pub trait TextEnv: Send {
    /// Starts the game over from its initial state.
    fn reset(&mut self) -> EnvStep;
    /// Applies one command. Unknown commands are not errors: the game answers as the reference
    /// engine does (ALFWorld: "Nothing happens.") and the step still counts.
    fn step(&mut self, command: &str) -> EnvStep;
    /// Like [`TextEnv::step`], for games where a command can fail the way the reference engine
    /// raises (WebShop): `Err` carries the message, and the pool reports it as that env's error.
    fn step_checked(&mut self, command: &str) -> Result<EnvStep, String> {
        Ok(self.step(command))
    }
    /// Task category (ALFWorld: one of the six task types).
    fn task_type(&self) -> &str;
    /// The task description shown to the agent (ALFWorld: the text after "Your task is to: ").
    fn task(&self) -> &str;
}

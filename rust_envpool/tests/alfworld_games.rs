//! Every shared ALFWorld game (found through ALFWORLD_DATA; skipped when unset): loads, the
//! expert wins within the step limit, and hostile commands change nothing. `cargo test --release`
//! covers every game; a debug build a fixed spread.

use std::path::PathBuf;
use std::sync::Arc;

use pcsd_envpool::envs::alfworld::{AlfworldEnv, GameSpec, TASK_TYPES};
use pcsd_envpool::envs::TextEnv;

fn games() -> Option<Vec<(String, PathBuf)>> {
    let root = PathBuf::from(std::env::var_os("ALFWORLD_DATA")?);
    let manifest = std::fs::read_to_string(root.join("MANIFEST.tsv")).ok()?;
    Some(
        manifest
            .lines()
            .skip(1)
            .filter_map(|l| {
                let cols: Vec<&str> = l.split('\t').collect();
                (cols.len() >= 3).then(|| (cols[1].to_string(), root.join("json_2.1.1").join(cols[2])))
            })
            .collect(),
    )
}

#[test]
fn every_shared_game_loads_and_the_expert_wins() {
    let Some(games) = games() else {
        eprintln!("ALFWORLD_DATA not set: skipped");
        return;
    };
    assert!(!games.is_empty());
    // Unoptimised builds check a fixed spread (every 8th game); `--release` checks all of them.
    let stride = if cfg!(debug_assertions) { 8 } else { 1 };
    let hostile = [
        "",
        "  ",
        "LOOK",
        "put apple 1 in fridge 1",
        "go to",
        &"x".repeat(5000),
        "ü🙂",
    ];
    for (task_type, path) in games.iter().step_by(stride) {
        let spec = Arc::new(GameSpec::from_path(path).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(spec.task_type(), task_type, "{}", path.display());
        assert!(TASK_TYPES.contains(&spec.task_type()));
        let mut env = AlfworldEnv::new(spec, 50);
        let start = env.reset();
        assert!(start.obs.starts_with("-= Welcome to TextWorld, ALFRED! =-\n\n"));
        for c in hostile {
            let s = env.step(c);
            assert_eq!(s.obs, "Nothing happens.");
            assert_eq!(s.admissible, start.admissible);
        }
        let plan = env
            .expert_plan()
            .unwrap_or_else(|| panic!("no plan: {}", path.display()));
        assert!(env.steps() + plan.len() <= 50);
        let mut last = None;
        for c in &plan {
            last = Some(env.step(c));
        }
        let last = last.expect("a non-empty plan");
        assert!(
            last.won && last.done && last.score == 1.0,
            "{}: {plan:?}",
            path.display()
        );
    }
}

/// Plays `spec` through the fast engine and the plain reference engine
/// (`AlfworldEnv::new_reference`) with the same seeded commands — random admissible ones, the
/// expert's next move, padded or re-cased admissible ones, hostile ones — and demands identical
/// observations, admissible lists, score / done / won and step counts. Returns the steps played.
fn play_both(spec: Arc<GameSpec>, seed: u64, episodes: usize, max_steps: usize) -> usize {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut fast = AlfworldEnv::new(spec.clone(), max_steps);
    let mut plain = AlfworldEnv::new_reference(spec.clone(), max_steps);
    let hostile = [
        "",
        "  ",
        "LOOK",
        "go to",
        "put apple 1 in fridge 1",
        "take the moon",
        "ü🙂",
        "help me",
    ];
    let mut played = 0;
    for ep in 0..episodes {
        let (a, b) = (fast.reset(), plain.reset());
        assert_eq!(a, b, "{}: reset of episode {ep}", spec.source());
        let mut adm = a.admissible;
        for step in 0..max_steps + 3 {
            let roll = rng.gen_range(0..100);
            let cmd = if adm.is_empty() || roll < 8 {
                hostile[rng.gen_range(0..hostile.len())].to_string()
            } else if roll < 20 {
                match fast.expert_plan().and_then(|p| p.into_iter().next()) {
                    Some(c) => c,
                    None => adm[rng.gen_range(0..adm.len())].clone(),
                }
            } else if roll < 26 {
                format!("  {} \t", adm[rng.gen_range(0..adm.len())])
            } else if roll < 30 {
                adm[rng.gen_range(0..adm.len())].to_uppercase()
            } else {
                adm[rng.gen_range(0..adm.len())].clone()
            };
            let (a, b) = (fast.step(&cmd), plain.step(&cmd));
            assert_eq!(a, b, "{}: episode {ep} step {step} command {cmd:?}", spec.source());
            assert_eq!(
                (fast.steps(), fast.won(), fast.is_done()),
                (plain.steps(), plain.won(), plain.is_done())
            );
            assert_eq!(fast.admissible_commands(), plain.admissible_commands());
            played += 1;
            adm = a.admissible;
        }
    }
    played
}

#[test]
fn fast_engine_plays_every_shared_game_like_the_reference() {
    let Some(games) = games() else {
        eprintln!("ALFWORLD_DATA not set: skipped");
        return;
    };
    let stride = if cfg!(debug_assertions) { 16 } else { 1 };
    let mut steps = 0;
    for (i, (_, path)) in games.iter().enumerate().step_by(stride) {
        let spec = Arc::new(GameSpec::from_path(path).unwrap_or_else(|e| panic!("{e}")));
        steps += play_both(spec, i as u64, 2, 50);
    }
    assert!(steps >= games.len() / stride * 100);
}

#[test]
fn fast_engine_plays_generated_games_like_the_reference() {
    use pcsd_envpool::envs::alfworld_gen::{generate, GenConfig, TaskType};
    for seed in 0..8u64 {
        for tt in TaskType::ALL {
            let text = generate(tt, seed, &GenConfig::default()).unwrap();
            let spec = Arc::new(GameSpec::from_json_str(&text, &format!("{}-{seed}", tt.as_str())).unwrap());
            // A short step limit too, so that episodes end by the limit as well as by winning.
            play_both(spec.clone(), seed, 2, 50);
            play_both(spec, seed + 100, 3, 7);
        }
    }
}

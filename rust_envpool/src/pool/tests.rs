//! The threaded pool on the dummy env: sync mode, async ordering, auto-reset, step limit, panic
//! isolation, bad ids, and a property test against the sequential reference.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::reference::SequentialPool;
use super::*;
use crate::envs::dummy::{DummyConfig, DummyEnv};

fn dummy_factories(num_games: usize, episode_len: u32, panic_game: Option<(usize, u32)>) -> Vec<EnvFactory> {
    (0..num_games)
        .map(|g| {
            let cfg = DummyConfig {
                seed: 100 + g as u64,
                episode_len,
                busy_iters: 0,
                panic_at_step: panic_game.filter(|(pg, _)| *pg == g).map(|(_, s)| s),
            };
            Box::new(move || Box::new(DummyEnv::new(cfg.clone())) as Box<dyn TextEnv>) as EnvFactory
        })
        .collect()
}

fn pool(num_games: usize, cfg: PoolConfig) -> EnvPool {
    EnvPool::new(dummy_factories(num_games, 3, None), cfg).unwrap()
}

fn ids(n: usize) -> Vec<i64> {
    (0..n as i64).collect()
}

fn target(game: usize, t: u32) -> String {
    DummyEnv::new(DummyConfig {
        seed: 100 + game as u64,
        episode_len: 3,
        ..Default::default()
    })
    .target(t)
    .to_owned()
}

fn arg_of(e: PoolError) -> &'static str {
    match e {
        PoolError::InvalidArgument { arg, .. } => arg,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn sync_reset_and_step_in_id_order_with_groups() {
    let mut p = pool(
        3,
        PoolConfig {
            num_threads: 2,
            group_size: 2,
            ..Default::default()
        },
    );
    assert_eq!(
        (p.num_envs(), p.num_games(), p.group_size(), p.num_threads()),
        (6, 3, 2, 2)
    );
    let r = p.reset(&[5, 0, 3]).unwrap();
    assert_eq!(r.iter().map(|x| x.env_id).collect::<Vec<_>>(), vec![5, 0, 3]);
    let all = p.reset(&ids(6)).unwrap();
    // The two envs of a group play the same game: identical observations.
    for g in 0..3 {
        assert_eq!(all[2 * g].obs, all[2 * g + 1].obs);
        assert!(all[2 * g].obs.contains(&format!("Dummy game {}", 100 + g)));
    }
    assert_ne!(all[0].obs, all[2].obs);
    // Step group 1 right and everyone else wrong... env ids in any order.
    let actions: Vec<String> = (0..6)
        .map(|i| if i / 2 == 1 { target(1, 0) } else { "x".into() })
        .collect();
    let order = [4, 2, 0, 1, 3, 5];
    let acts = order.iter().map(|&i| actions[i].clone()).collect();
    let r = p.step(acts, &order.map(|i| i as i64)).unwrap();
    for (res, &i) in r.iter().zip(&order) {
        assert_eq!(res.env_id, i as i64);
        assert_eq!(res.step_count, 1);
        let expect = if i / 2 == 1 { 1.0 / 3.0 } else { 0.0 };
        assert!((res.reward - expect).abs() < 1e-12 && res.error.is_none());
    }
    assert_eq!(p.outstanding(), 0);
}

#[test]
fn sync_mode_is_send_all_then_recv_all() {
    let mut p = pool(
        4,
        PoolConfig {
            num_threads: 2,
            ..Default::default()
        },
    );
    let mut q = pool(
        4,
        PoolConfig {
            num_threads: 2,
            ..Default::default()
        },
    );
    p.reset(&ids(4)).unwrap();
    q.send_reset(&ids(4)).unwrap();
    let mut got = q.recv(4).unwrap();
    got.sort_by_key(|r| r.env_id);
    assert_eq!(got, p.reset(&ids(4)).unwrap());
}

#[test]
fn async_recv_returns_first_finishers_in_completion_order() {
    let mut p = pool(
        4,
        PoolConfig {
            num_threads: 4,
            ..Default::default()
        },
    );
    p.reset(&ids(4)).unwrap();
    let acts = ["sleep 400", "sleep 10", "sleep 200", "sleep 10"]
        .map(String::from)
        .to_vec();
    p.send(acts[..3].to_vec(), &[0, 1, 2]).unwrap();
    assert_eq!((p.in_flight(), p.outstanding()), (3, 3));
    let first = p.recv(1).unwrap();
    assert_eq!(first[0].env_id, 1);
    // Env 1 is idle again and can be sent to while 0 and 2 still run.
    p.send(vec![acts[3].clone()], &[1]).unwrap();
    let next = p.recv(2).unwrap();
    assert_eq!(next.iter().map(|r| r.env_id).collect::<Vec<_>>(), vec![1, 2]);
    let last = p.recv(1).unwrap();
    assert_eq!(last[0].env_id, 0);
    assert_eq!(last[0].step_count, 1);
    assert_eq!(p.outstanding(), 0);
}

#[test]
fn recv_errors_name_batch_size() {
    let mut p = pool(2, PoolConfig::default());
    let e = p.recv(1).unwrap_err();
    assert!(e.to_string().contains("nothing is pending"), "{e}");
    assert_eq!(arg_of(e), "batch_size");
    p.send_reset(&[0]).unwrap();
    assert_eq!(arg_of(p.recv(0).unwrap_err()), "batch_size");
    assert_eq!(arg_of(p.recv(2).unwrap_err()), "batch_size");
    assert_eq!(p.recv(1).unwrap().len(), 1);
}

#[test]
fn malformed_calls_change_nothing() {
    let mut p = pool(3, PoolConfig::default());
    assert_eq!(arg_of(p.step(vec!["a".into()], &[0, 1]).unwrap_err()), "actions");
    assert_eq!(arg_of(p.send(vec!["a".into(); 2], &[1, 1]).unwrap_err()), "env_ids");
    assert_eq!(arg_of(p.reset(&[2, 0, 2]).unwrap_err()), "env_ids");
    assert_eq!(p.outstanding(), 0, "a refused call sends nothing");
    p.send_reset(&[0]).unwrap();
    let e = p.step(vec!["a".into(), "b".into()], &[1, 0]).unwrap_err();
    assert!(e.to_string().contains("already has a request outstanding"), "{e}");
    assert_eq!(p.outstanding(), 1, "env 1 was not sent either");
    assert_eq!(p.recv(1).unwrap()[0].env_id, 0);
}

#[test]
fn bad_env_ids_are_reported_per_env() {
    let mut p = pool(2, PoolConfig::default());
    let r = p.reset(&[0, 7, -1, 1]).unwrap();
    assert!(r[0].error.is_none() && r[3].error.is_none());
    for bad in [&r[1], &r[2]] {
        assert!(bad.done && bad.obs.is_empty());
        assert!(
            bad.error.as_deref().unwrap().contains("out of range"),
            "{:?}",
            bad.error
        );
    }
    assert_eq!((r[1].env_id, r[2].env_id), (7, -1));
    // Async: the rejection is ready at once, ahead of the envs still running.
    p.send(vec!["sleep 100".into(), "x".into()], &[0, 9]).unwrap();
    let first = p.recv(1).unwrap();
    assert_eq!(first[0].env_id, 9);
    assert!(first[0].error.is_some());
    assert_eq!(p.recv(1).unwrap()[0].env_id, 0);
}

#[test]
fn manual_reset_mode_rejects_done_envs_until_reset() {
    let mut p = pool(
        2,
        PoolConfig {
            num_threads: 2,
            ..Default::default()
        },
    );
    let r = p.step(vec!["x".into()], &[0]).unwrap();
    assert!(r[0].error.as_deref().unwrap().contains("not been reset"));
    p.reset(&[0, 1]).unwrap();
    for _ in 0..3 {
        p.step(vec!["x".into(), "x".into()], &[0, 1]).unwrap();
    }
    let r = p.step(vec!["x".into(), "x".into()], &[0, 1]).unwrap();
    assert!(r
        .iter()
        .all(|x| x.done && x.error.as_deref().unwrap().contains("is done")));
    // Finished envs leave the batch: the others are unaffected, and a reset brings them back.
    let r = p.reset(&[1]).unwrap();
    assert!(!r[0].done && r[0].error.is_none());
    let r = p.step(vec![target(1, 0)], &[1]).unwrap();
    assert!(r[0].error.is_none() && r[0].step_count == 1);
}

#[test]
fn auto_reset_rule_through_the_pool() {
    let mut p = pool(
        1,
        PoolConfig {
            num_threads: 1,
            group_size: 1,
            max_steps: 0,
            auto_reset: true,
            ..Default::default()
        },
    );
    // First step on a fresh env resets it.
    let r = &p.step(vec!["x".into()], &[0]).unwrap()[0];
    assert_eq!((r.step_count, r.done, r.reward), (0, false, 0.0));
    let mut last = None;
    for t in 0..3 {
        last = Some(p.step(vec![target(0, t)], &[0]).unwrap().remove(0));
    }
    let last = last.unwrap();
    assert!(last.done && last.won && last.step_count == 3 && last.obs.contains("game is over"));
    let r = &p.step(vec!["ignored".into()], &[0]).unwrap()[0];
    assert!(!r.done && r.step_count == 0 && r.score == 0.0 && r.obs.contains("step 1 of 3"));
}

#[test]
fn step_limit_truncates() {
    let mut p = pool(
        2,
        PoolConfig {
            num_threads: 2,
            group_size: 1,
            max_steps: 2,
            auto_reset: false,
            ..Default::default()
        },
    );
    p.reset(&ids(2)).unwrap();
    let r = p.step(vec![target(0, 0), "x".into()], &ids(2)).unwrap();
    assert!(r.iter().all(|x| !x.done));
    let r = p.step(vec![target(0, 1), "x".into()], &ids(2)).unwrap();
    assert!(r
        .iter()
        .all(|x| x.done && x.truncated && !x.won && x.step_count == 2 && x.error.is_none()));
    assert!((r[0].score - 2.0 / 3.0).abs() < 1e-12);
}

#[test]
fn a_panicking_env_is_isolated() {
    let f = dummy_factories(2, 5, Some((1, 2)));
    let mut p = EnvPool::new(
        f,
        PoolConfig {
            num_threads: 2,
            group_size: 2,
            ..Default::default()
        },
    )
    .unwrap();
    p.reset(&ids(4)).unwrap();
    p.step(vec!["x".into(); 4], &ids(4)).unwrap();
    let r = p.step(vec!["x".into(); 4], &ids(4)).unwrap();
    for x in &r[..2] {
        assert!(x.error.is_none() && x.step_count == 2);
    }
    for x in &r[2..] {
        assert!(
            x.done && x.error.as_deref().unwrap().contains("panicked in step 2"),
            "{:?}",
            x.error
        );
    }
    let r = p.step(vec!["x".into(); 4], &ids(4)).unwrap();
    assert!(r[0].error.is_none() && r[2].error.as_deref().unwrap().contains("is broken"));
    // Reset revives it (and it will panic again at its step 2, as told).
    let r = p.reset(&[2]).unwrap();
    assert!(r[0].error.is_none() && !r[0].done);
    assert!(p.step(vec!["x".into()], &[2]).unwrap()[0].error.is_none());
}

#[test]
fn interrupt_leaves_requests_outstanding() {
    let mut p = pool(
        2,
        PoolConfig {
            num_threads: 2,
            ..Default::default()
        },
    );
    p.reset(&ids(2)).unwrap();
    let t0 = Instant::now();
    let mut calls = 0;
    let e = p
        .step_interruptible(vec!["sleep 300".into(), "x".into()], &ids(2), &mut || {
            calls += 1;
            true
        })
        .unwrap_err();
    assert_eq!(e, PoolError::Interrupted);
    assert!(calls >= 1 && t0.elapsed() < Duration::from_millis(250));
    assert_eq!(p.outstanding(), 2);
    let mut r = p.recv(2).unwrap();
    r.sort_by_key(|x| x.env_id);
    assert_eq!(r.iter().map(|x| x.step_count).collect::<Vec<_>>(), vec![1, 1]);
}

#[test]
fn interrupt_is_checked_while_results_trickle_in() {
    // 1 thread, 8 envs finishing 30 ms apart: no 50 ms gap without a result, yet the check runs.
    let mut p = pool(
        8,
        PoolConfig {
            num_threads: 1,
            ..Default::default()
        },
    );
    p.reset(&ids(8)).unwrap();
    p.send(vec!["sleep 30".into(); 8], &ids(8)).unwrap();
    let t0 = Instant::now();
    let e = p.recv_interruptible(8, &mut || true).unwrap_err();
    assert_eq!(e, PoolError::Interrupted);
    assert!(t0.elapsed() < Duration::from_millis(150), "{:?}", t0.elapsed());
    assert_eq!(p.outstanding(), 8);
    assert_eq!(p.recv(8).unwrap().len(), 8);
}

#[test]
fn construction_errors() {
    let e = EnvPool::new(Vec::new(), PoolConfig::default()).err().unwrap();
    assert_eq!(arg_of(e), "games");
    let e = EnvPool::new(
        dummy_factories(1, 3, None),
        PoolConfig {
            group_size: 0,
            ..Default::default()
        },
    );
    assert_eq!(arg_of(e.err().unwrap()), "group_size");
    let f: Vec<EnvFactory> = vec![Box::new(|| panic!("cannot load"))];
    let e = EnvPool::new(f, PoolConfig::default()).err().unwrap();
    assert!(
        matches!(e, PoolError::Setup(ref m) if m.contains("factory of game 0")),
        "{e:?}"
    );
}

#[test]
fn threads_setting_and_drop_with_work_in_flight() {
    let mut p = pool(
        2,
        PoolConfig {
            num_threads: 3,
            ..Default::default()
        },
    );
    assert_eq!(p.num_threads(), 3);
    p.reset(&ids(2)).unwrap();
    p.send(vec!["sleep 50".into(), "sleep 50".into()], &ids(2)).unwrap();
    drop(p); // must neither block on nor crash the running requests
}

// ---- property test: random call sequences vs the sequential reference ----

#[derive(Clone, Debug)]
enum Call {
    Reset(Vec<i64>),
    Step(Vec<i64>, Vec<u8>),
    Send(Vec<i64>, Vec<u8>),
    SendReset(Vec<i64>),
    Recv(usize),
}

const NUM_GAMES: usize = 3;
const GROUP: usize = 2;
const N: i64 = (NUM_GAMES * GROUP) as i64;

fn action(k: u8) -> String {
    ["go east", "go north", "go south", "go west", "look"][k as usize % 5].to_owned()
}

fn id_list() -> impl Strategy<Value = Vec<i64>> {
    // Mostly valid ids, sometimes out of range, sometimes duplicated.
    prop::collection::vec(prop_oneof![8 => 0..N, 1 => Just(N), 1 => Just(-1)], 0..5)
}

/// Ids plus actions; one time in five the action count is arbitrary (a length mismatch).
fn ids_and_actions() -> impl Strategy<Value = (Vec<i64>, Vec<u8>)> {
    (id_list(), prop::collection::vec(any::<u8>(), 0..6), 0u8..5).prop_map(|(ids, mut a, k)| {
        if k > 0 {
            a.resize(ids.len(), 0);
        }
        (ids, a)
    })
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        2 => id_list().prop_map(Call::Reset),
        2 => ids_and_actions().prop_map(|(i, a)| Call::Step(i, a)),
        3 => ids_and_actions().prop_map(|(i, a)| Call::Send(i, a)),
        1 => id_list().prop_map(Call::SendReset),
        3 => (0usize..5).prop_map(Call::Recv),
    ]
}

/// `results` with their `string_ids` checked against the pool's table and taken out (the
/// reference has none).
fn without_ids(pool: &EnvPool, mut results: Vec<StepResult>) -> Vec<StepResult> {
    for r in &mut results {
        match (pool.string_table(), r.string_ids.take()) {
            (Some(t), Some(ids)) => {
                let texts = r.admissible.iter().chain([&r.task_type]);
                let want: Vec<u32> = texts.map(|s| t.get(s).expect("a string without an id")).collect();
                assert_eq!(ids, want);
            }
            (Some(_), None) => assert!(r.error.is_some(), "only requests rejected at send have no ids"),
            (None, None) => {}
            (None, Some(_)) => panic!("ids from a pool without a string table"),
        }
    }
    results
}

fn same_outcome<T>(a: &Result<T, PoolError>, b: &Result<T, PoolError>) -> bool {
    match (a, b) {
        (Ok(_), Ok(_)) => true,
        (Err(PoolError::InvalidArgument { arg: x, .. }), Err(PoolError::InvalidArgument { arg: y, .. })) => x == y,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_sequential_reference(
        calls in prop::collection::vec(call(), 1..25),
        auto_reset in any::<bool>(),
        max_steps in 0u32..4,
        threads in 1usize..4,
        string_ids in any::<bool>(),
    ) {
        let cfg = PoolConfig { num_threads: threads, group_size: GROUP, max_steps, auto_reset, string_ids };
        let mut pool = EnvPool::new(dummy_factories(NUM_GAMES, 3, Some((2, 2))), cfg).unwrap();
        let mut model = SequentialPool::new(dummy_factories(NUM_GAMES, 3, Some((2, 2))), cfg).unwrap();
        for c in calls {
            match c {
                Call::Reset(ids) => {
                    let (a, b) = (pool.reset(&ids), model.reset(&ids));
                    prop_assert!(same_outcome(&a, &b), "{a:?} vs {b:?}");
                    if let (Ok(a), Ok(b)) = (a, b) { prop_assert_eq!(without_ids(&pool, a), b); }
                }
                Call::Step(ids, acts) => {
                    let acts: Vec<String> = acts.into_iter().map(action).collect();
                    let (a, b) = (pool.step(acts.clone(), &ids), model.step(acts, &ids));
                    prop_assert!(same_outcome(&a, &b), "{a:?} vs {b:?}");
                    if let (Ok(a), Ok(b)) = (a, b) { prop_assert_eq!(without_ids(&pool, a), b); }
                }
                Call::Send(ids, acts) => {
                    let acts: Vec<String> = acts.into_iter().map(action).collect();
                    let (a, b) = (pool.send(acts.clone(), &ids), model.send(acts, &ids));
                    prop_assert!(same_outcome(&a, &b), "{a:?} vs {b:?}");
                }
                Call::SendReset(ids) => {
                    let (a, b) = (pool.send_reset(&ids), model.send_reset(&ids));
                    prop_assert!(same_outcome(&a, &b), "{a:?} vs {b:?}");
                }
                Call::Recv(n) => {
                    let expect_ok = n >= 1 && n <= model.outstanding();
                    let got = pool.recv(n);
                    prop_assert_eq!(got.is_ok(), expect_ok, "recv({}) with {} outstanding: {:?}", n, model.outstanding(), got);
                    if let Ok(got) = got {
                        prop_assert_eq!(got.len(), n);
                        // Completion order may differ from send order: every result must be one the
                        // reference computed for an outstanding request.
                        for r in &without_ids(&pool, got) {
                            prop_assert!(model.recv_matching(r), "unexpected result {:?}", r);
                        }
                    }
                }
            }
            prop_assert_eq!(pool.outstanding(), model.outstanding());
        }
        // Drain and compare the rest.
        let rest = model.outstanding();
        if rest > 0 {
            let got = pool.recv(rest).unwrap();
            for r in without_ids(&pool, got) {
                prop_assert!(model.recv_matching(&r), "unexpected result {:?}", r);
            }
        }
        prop_assert_eq!(model.outstanding(), 0);
    }
}

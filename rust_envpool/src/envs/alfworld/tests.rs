//! Core engine tests on a small hand-written game (own domain, problem and grammar).

use super::*;
use proptest::prelude::*;

const DOMAIN: &str = r#"
(define (domain mini)
 (:requirements :adl :typing)
 (:types agent location receptacle object rtype otype)
 (:predicates (atLocation ?a - agent ?l - location))
 ; a comment (with parentheses)
 (:action look
    :parameters (?a - agent ?l - location)
    :precondition (and (atLocation ?a ?l))
    :effect (and (checked ?l)))
 (:action help
    :parameters (?a - agent)
    :precondition ()
    :effect (and (checked ?a)))
 (:action GotoLocation
    :parameters (?a - agent ?lStart - location ?lEnd - location ?r - receptacle)
    :precondition (and (atLocation ?a ?lStart) (receptacleAtLocation ?r ?lEnd))
    :effect (and (not (atLocation ?a ?lStart)) (atLocation ?a ?lEnd) (increase (total-cost) 1)))
 (:action OpenObject
    :parameters (?a - agent ?l - location ?r - receptacle)
    :precondition (and (openable ?r) (atLocation ?a ?l) (receptacleAtLocation ?r ?l) (not (opened ?r)))
    :effect (and (opened ?r)))
 (:action PickupObject
    :parameters (?a - agent ?l - location ?o - object ?r - receptacle)
    :precondition (and (atLocation ?a ?l) (receptacleAtLocation ?r ?l) (inReceptacle ?o ?r)
                       (not (holdsAny ?a)) (or (not (openable ?r)) (opened ?r)))
    :effect (and (not (inReceptacle ?o ?r)) (holds ?a ?o) (holdsAny ?a)))
 (:action PutObject
    :parameters (?a - agent ?l - location ?o - object ?r - receptacle ?ot - otype ?rt - rtype)
    :precondition (and (holds ?a ?o) (atLocation ?a ?l) (receptacleAtLocation ?r ?l)
                       (or (not (openable ?r)) (opened ?r))
                       (objectType ?o ?ot) (receptacleType ?r ?rt) (canContain ?rt ?ot))
    :effect (and (inReceptacle ?o ?r) (not (holds ?a ?o)) (not (holdsAny ?a))))
 (:action examineObject
    :parameters (?a - agent ?o - object)
    :precondition (or (exists (?l - location, ?r - receptacle) (and (atLocation ?a ?l) (inReceptacle ?o ?r)))
                      (holds ?a ?o))
    :effect (and (checked ?o)))
 (:action HeatObject
    :parameters (?a - agent ?l - location ?r - receptacle ?o - object)
    :precondition (and (receptacleType ?r OvenType) (atLocation ?a ?l) (receptacleAtLocation ?r ?l) (holds ?a ?o))
    :effect (and (isHot ?o) (not (isCool ?o))))
)
"#;

fn problem(goal: &str) -> String {
    format!(
        r#"
(define (problem p1)
 (:domain mini)
 (:objects agent1 - agent
   Shelf_bar_1 Shelf_bar_2 Shelf_bar_10 Box_bar_9 Oven_bar_1 - receptacle
   loc_bar_0 loc_bar_1 loc_bar_2 loc_bar_3 - location
   Cup_bar__plus_1 Cup_bar__minus_1 Pen_bar_1 - object
   ShelfType BoxType OvenType - rtype
   CupType PenType - otype)
 (:init
   (atLocation agent1 loc_bar_0)
   (receptacleAtLocation Shelf_bar_1 loc_bar_1)
   (receptacleAtLocation Shelf_bar_2 loc_bar_1)
   (receptacleAtLocation Shelf_bar_10 loc_bar_2)
   (receptacleAtLocation Box_bar_9 loc_bar_2)
   (receptacleAtLocation Oven_bar_1 loc_bar_3)
   (openable Box_bar_9)
   (receptacleType Shelf_bar_1 ShelfType)
   (receptacleType Shelf_bar_2 ShelfType)
   (receptacleType Shelf_bar_10 ShelfType)
   (receptacleType Box_bar_9 BoxType)
   (receptacleType Oven_bar_1 OvenType)
   (objectType Cup_bar__plus_1 CupType)
   (objectType Cup_bar__minus_1 CupType)
   (objectType Pen_bar_1 PenType)
   (canContain ShelfType CupType)
   (canContain BoxType CupType)
   (canContain BoxType PenType)
   (inReceptacle Cup_bar__plus_1 Shelf_bar_1)
   (inReceptacle Cup_bar__minus_1 Shelf_bar_1)
   (inReceptacle Pen_bar_1 Box_bar_9))
 (:goal {goal}))
"#
    )
}

const GRAMMAR: &str = r####"
grammar :: """
{
  "intro": [{"rhs": "== MINI ==\n\n#look.feedback#\n\n#task#"}],
  "task": [{"rhs": "Your task is to: warm a cup and shelve it."}],
  "GotoLocation.feedback": [{"rhs": "You reach {r.name}. #examineReceptacle.feedback#"}],
  "examineReceptacle.feedback": [
     {"condition": "openable(r:receptacle) & opened(r:receptacle)",
      "rhs": "Inside the {r.name}: [{o.indefinite + ' ' + o.name | inreceptacle(o:object, r:receptacle)}]."},
     {"condition": "openable(r:receptacle)", "rhs": "The {r.name} is shut."},
     {"rhs": "On the {r.name}: [{o.indefinite + ' ' + o.name | inreceptacle(o:object, r:receptacle)}]."}
  ],
  "examineObject.feedback": [
     {"condition": "ishot(o:object)", "rhs": "A warm {o.name}."},
     {"rhs": "Just a {o.name}."}
  ],
  "list_empty": [{"rhs": "nothing"}],
  "list_separator": [{"rhs": ", "}],
  "list_last_separator": [{"rhs": ", and "}]
}
""";

action GotoLocation {
    template :: "go to [{r.name | receptacleatlocation(r:receptacle, lend:location)}]";
    feedback :: "#GotoLocation.feedback#";
}
action OpenObject {
    template :: "open {r}";
    feedback :: "You open the {r.name}. #examineReceptacle.feedback#";
}
action PickupObject {
    template :: "take {o} from {r}";
    feedback :: "You take the {o.name} from the {r.name}.";
}
action PutObject {
    template :: "move {o} to {r}";
    feedback :: "You put the {o.name} on the {r.name}.";
}
action examineObject {
    template :: "examine {o}";
    feedback :: "#examineObject.feedback#";
}
action HeatObject {
    template :: "heat {o} with {r}";
    feedback :: "You warm the {o.name} in the {r.name}.";
}
action look {
    template :: "look";
    feedback :: "#look.feedback#";
    grammar :: """
    {
      # comment lines are dropped from action grammars
      "look.feedback": [
        {"condition": "atlocation(a:agent, l:location) & receptacleatlocation(r:receptacle, l:location)",
         "rhs": "You stand by the [{r.name | atlocation(a:agent, l:location) & receptacleatlocation(r:receptacle, l:location)}]."},
        {"rhs": "You are in a room with [{#overview(r)# | receptacleatlocation(r:receptacle, l:location)}]."}
      ],
      "overview(r)": [{"rhs": "{r.indefinite} {r.name or r.id}"}]
    }
    """;
}
action help {
    template :: "help";
    feedback :: "
Commands:
  look
";
}
"####;

const GOAL_HOT: &str = "(exists (?r - receptacle ?o - object) (and (objectType ?o CupType) (receptacleType ?r ShelfType) (isHot ?o) (inReceptacle ?o ?r)))";

fn game_json(goal: &str) -> String {
    serde_json::json!({
        "pddl_domain": DOMAIN,
        "pddl_problem": problem(goal),
        "grammar": GRAMMAR,
        "walkthrough": [],
        "solvable": true,
    })
    .to_string()
}

fn env(goal: &str, max_steps: usize) -> AlfworldEnv {
    let spec = GameSpec::from_json_str(&game_json(goal), "mini.tw-pddl").expect("mini game loads");
    AlfworldEnv::new(Arc::new(spec), max_steps)
}

#[test]
fn demangled_names_number_sorted_ids_from_the_top() {
    let ids: Vec<String> = [
        "shelf_bar_1",
        "shelf_bar_10",
        "shelf_bar_2",
        "sink_bar_1_bar_sinkbasin",
        "agent1",
        "cup_bar__plus_1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let names = demangle(&ids).unwrap();
    // sorted: shelf_bar_1 < shelf_bar_10 < shelf_bar_2 -> 3, 2, 1
    assert_eq!(
        names,
        vec!["shelf 3", "shelf 2", "shelf 1", "sinkbasin 1", "agent1 ", "cup 1"]
    );
}

#[test]
fn reset_text_lists_receptacles_in_id_order() {
    let mut e = env(GOAL_HOT, 50);
    let s = e.reset();
    // ids sorted: box_bar_9, oven_bar_1, shelf_bar_1, shelf_bar_10, shelf_bar_2
    assert_eq!(
        s.obs,
        "== MINI ==\n\nYou are in a room with a box 1, a oven 1, a shelf 3, a shelf 2, and a shelf 1.\n\n\
         Your task is to: warm a cup and shelve it."
    );
    assert_eq!(e.task(), "warm a cup and shelve it.");
    assert_eq!(e.task_type(), "pick_heat_then_place_in_recep");
    assert!(!s.done && !s.won && s.score == 0.0);
    assert_eq!(
        s.admissible,
        vec![
            "go to box 1",
            "go to oven 1",
            "go to shelf 1",
            "go to shelf 2",
            "go to shelf 3",
            "help",
            "look"
        ]
    );
}

#[test]
fn look_binds_the_agent_location() {
    let mut e = env(GOAL_HOT, 50);
    e.reset();
    // At the start location no receptacle is bound to `l`: the list is empty.
    assert_eq!(e.step("look").obs, "You are in a room with nothing.");
    e.step("go to shelf 3");
    // Two receptacles share loc_bar_1: both are listed (", and " also for two items).
    assert_eq!(e.step("look").obs, "You stand by the shelf 3, and shelf 1.");
}

#[test]
fn go_to_only_other_locations_and_texts() {
    let mut e = env(GOAL_HOT, 50);
    e.reset();
    let s = e.step("go to shelf 3");
    assert_eq!(s.obs, "You reach shelf 3. On the shelf 3: a cup 2, and a cup 1.");
    // shelf 1 shares the location: no "go to shelf 1" / "go to shelf 3" any more.
    assert!(!s
        .admissible
        .iter()
        .any(|c| c == "go to shelf 1" || c == "go to shelf 3"));
    assert!(s.admissible.iter().any(|c| c == "go to shelf 2"));
    assert!(s.admissible.iter().any(|c| c == "take cup 1 from shelf 3"));
    // examine of an object in reach is not admissible (the exists has type `location,`).
    assert!(!s.admissible.iter().any(|c| c.starts_with("examine")));
    let s = e.step("go to box 1");
    assert_eq!(s.obs, "You reach box 1. The box 1 is shut.");
    let s = e.step("open box 1");
    assert_eq!(s.obs, "You open the box 1. Inside the box 1: a pen 1.");
    e.step("go to oven 1");
    let s = e.step("go to shelf 2");
    assert_eq!(s.obs, "You reach shelf 2. On the shelf 2: nothing.");
}

#[test]
fn invalid_commands_change_nothing_but_count() {
    let mut e = env(GOAL_HOT, 50);
    let start = e.reset();
    for (i, c) in [
        "",
        "   ",
        "LOOK",
        "put cup 1 in shelf 3",
        "take cup 1 from shelf 3",
        "gö to shelf 1",
    ]
    .iter()
    .enumerate()
    {
        let s = e.step(c);
        assert_eq!(s.obs, "Nothing happens.");
        assert_eq!(s.admissible, start.admissible);
        assert_eq!(e.steps(), i + 1);
    }
    // Outer whitespace (Python's str.strip set) is ignored.
    assert_eq!(
        e.step(" \t\x1cgo to shelf 1\n").obs,
        "You reach shelf 1. On the shelf 1: nothing."
    );
    assert_eq!(e.step("help").obs, "Commands:\n  look\n");
}

#[test]
fn heat_examine_and_win() {
    let mut e = env(GOAL_HOT, 50);
    e.reset();
    e.step("go to shelf 3");
    let s = e.step("take cup 1 from shelf 3");
    assert_eq!(s.obs, "You take the cup 1 from the shelf 3.");
    assert!(s.admissible.iter().any(|c| c == "examine cup 1"));
    assert_eq!(e.step("examine cup 1").obs, "Just a cup 1.");
    e.step("go to oven 1");
    assert_eq!(
        e.step("heat cup 1 with oven 1").obs,
        "You warm the cup 1 in the oven 1."
    );
    assert_eq!(e.step("examine cup 1").obs, "A warm cup 1.");
    e.step("go to shelf 1");
    let s = e.step("move cup 1 to shelf 1");
    assert!(s.won && s.done && s.score == 1.0);
    // A finished game keeps returning its last state, and steps stop counting.
    let n = e.steps();
    let again = e.step("look");
    assert_eq!(again, s);
    assert_eq!(e.steps(), n);
    // Reset starts over.
    let r = e.reset();
    assert!(!r.done && !r.won && e.steps() == 0);
}

#[test]
fn step_limit_ends_the_game() {
    let mut e = env(GOAL_HOT, 3);
    e.reset();
    assert!(!e.step("look").done);
    assert!(!e.step("xyzzy").done);
    let s = e.step("look");
    assert!(s.done && !s.won && s.score == 0.0);
    assert_eq!(e.step("go to oven 1"), s);
}

#[test]
fn expert_solves_every_goal_shape() {
    let goals = [
        GOAL_HOT,
        "(exists (?r - receptacle ?o - object) (and (objectType ?o CupType) (receptacleType ?r BoxType) (inReceptacle ?o ?r)))",
        "(exists (?r - receptacle ?o1 - object) (and (objectType ?o1 CupType) (receptacleType ?r BoxType) (inReceptacle ?o1 ?r) \
           (exists (?o2 - object) (and (not (= ?o1 ?o2)) (objectType ?o2 CupType) (inReceptacle ?o2 ?r)))))",
    ];
    for g in goals {
        let mut e = env(g, 50);
        e.reset();
        // From the start and from a disturbed state.
        for prefix in [&[][..], &["go to box 1", "open box 1", "take pen 1 from box 1"][..]] {
            e.reset();
            for c in prefix {
                e.step(c);
            }
            let plan = e.expert_plan().unwrap_or_else(|| panic!("no plan for {g}"));
            let mut last = None;
            for c in &plan {
                last = Some(e.step(c));
            }
            assert!(last.is_some_and(|s| s.won), "plan {plan:?} does not win {g}");
        }
    }
}

#[test]
fn load_errors_name_the_key() {
    let good: serde_json::Value = serde_json::from_str(&game_json(GOAL_HOT)).unwrap();
    for key in ["pddl_domain", "pddl_problem", "grammar"] {
        let mut v = good.clone();
        v.as_object_mut().unwrap().remove(key);
        let e = GameSpec::from_json_str(&v.to_string(), "g.tw-pddl")
            .unwrap_err()
            .to_string();
        assert!(e.contains("g.tw-pddl") && e.contains(key), "{e}");
        let mut v = good.clone();
        v[key] = serde_json::json!("(define (broken");
        let e = GameSpec::from_json_str(&v.to_string(), "g.tw-pddl")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{e}");
    }
    let e = GameSpec::from_path("/nonexistent/game.tw-pddl").unwrap_err();
    assert!(e.is_not_found() && e.to_string().contains("/nonexistent/game.tw-pddl"));
}

#[test]
fn fast_grounding_and_goal_match_the_plain_reference() {
    let goals = [
        GOAL_HOT,
        "(exists (?r - receptacle ?o1 - object) (and (objectType ?o1 CupType) (receptacleType ?r BoxType) (inReceptacle ?o1 ?r) \
           (exists (?o2 - object) (and (not (= ?o1 ?o2)) (objectType ?o2 CupType) (inReceptacle ?o2 ?r)))))",
    ];
    for (gi, g) in goals.iter().enumerate() {
        let mut e = env(g, 500);
        e.reset();
        let mut rng = 12345u64 + gi as u64;
        let mut wins = 0;
        for _ in 0..300 {
            let spec = e.spec.clone();
            assert_eq!(spec.applicable(&e.facts), spec.applicable_reference(&e.facts));
            let mut env1 = vec![u32::MAX; spec.goal_slots.max(1)];
            let mut env2 = env1.clone();
            let fast = spec.holds(&spec.goal, &mut env1, &e.facts);
            assert_eq!(fast, spec.holds_reference(&spec.goal, &mut env2, &e.facts));
            wins += fast as usize;
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let adm = e.admissible_commands().to_vec();
            let c = adm[(rng >> 33) as usize % adm.len()].clone();
            if e.step(&c).done {
                e.reset();
            }
        }
        // And in a won state (the expert's).
        e.reset();
        for c in e.expert_plan().expect("plan") {
            e.step(&c);
        }
        let spec = e.spec.clone();
        let mut env2 = vec![u32::MAX; spec.goal_slots.max(1)];
        assert!(spec.holds_reference(&spec.goal, &mut env2, &e.facts) && e.won());
        let _ = wins;
    }
}

#[test]
fn task_type_falls_back_on_the_folder_name() {
    let odd_goal = "(atLocation agent1 loc_bar_3)";
    let dir = std::env::temp_dir().join(format!("pcsd-alfworld-{}", std::process::id()));
    let game = dir
        .join("pick_cool_then_place_in_recep-Cup-None-Shelf-1")
        .join("trial_1");
    std::fs::create_dir_all(&game).unwrap();
    let path = game.join("game.tw-pddl");
    std::fs::write(&path, game_json(odd_goal)).unwrap();
    let from_file = GameSpec::from_path(&path).unwrap();
    let from_text = GameSpec::from_json_str(&game_json(odd_goal), "x").unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(from_text.task_type(), "unknown");
    assert_eq!(from_file.task_type(), "pick_cool_then_place_in_recep");
    // Goal content wins over the folder name.
    assert_eq!(
        GameSpec::from_json_str(&game_json(GOAL_HOT), "x").unwrap().task_type(),
        "pick_heat_then_place_in_recep"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_command_is_safe(cmds in proptest::collection::vec(".{0,40}|[a-z ]{0,30}|\\PC{4990,5010}", 1..12)) {
        let mut e = env(GOAL_HOT, 50);
        let start = e.reset();
        for c in &cmds {
            let before = e.admissible_commands().to_vec();
            let s = e.step(c);
            if !before.iter().any(|a| a == py_strip(c)) {
                prop_assert_eq!(&s.obs, "Nothing happens.");
                prop_assert_eq!(&s.admissible, &before);
            }
        }
        prop_assert!(e.steps() == cmds.len());
        prop_assert!(!start.admissible.is_empty());
    }

    #[test]
    fn odd_predicate_names_do_not_panic(name in "(not_){0,3}[a-z]{1,3}") {
        let v: serde_json::Value = serde_json::from_str(&game_json(GOAL_HOT)).unwrap();
        let mut v2 = v.clone();
        let g = v["grammar"].as_str().unwrap().replace("ishot(o:object)", &format!("{name}(o:object)"));
        v2["grammar"] = serde_json::Value::String(g);
        let p = v["pddl_problem"].as_str().unwrap().replace("(openable Box_bar_9)", &format!("(openable Box_bar_9) ({name} Cup_bar__plus_1)"));
        v2["pddl_problem"] = serde_json::Value::String(p);
        let spec = GameSpec::from_json_str(&v2.to_string(), "odd").unwrap();
        let mut e = AlfworldEnv::new(Arc::new(spec), 50);
        e.reset();
        for c in ["go to shelf 3", "take cup 1 from shelf 3", "examine cup 1"] {
            e.step(c);
        }
    }

    #[test]
    fn corrupted_games_error_without_panicking(cut in 0usize..20_000, flip in 0usize..20_000, byte in any::<u8>()) {
        let text = game_json(GOAL_HOT);
        let t = &text.as_bytes()[..cut.min(text.len())];
        let _ = GameSpec::from_json_str(&String::from_utf8_lossy(t), "cut");
        let mut b = text.clone().into_bytes();
        let i = flip % b.len();
        b[i] = byte;
        if let Ok(s) = GameSpec::from_json_str(&String::from_utf8_lossy(&b), "flip") {
            let mut e = AlfworldEnv::new(Arc::new(s), 5);
            e.reset();
            e.step("look");
            let _ = e.expert_plan();
        }
    }

    #[test]
    fn corrupted_pddl_and_grammar_do_not_panic(which in 0usize..3, cut in 0usize..5000, junk in "[()\\[\\]{}#|:;\"a-z ?-]{0,30}") {
        let v: serde_json::Value = serde_json::from_str(&game_json(GOAL_HOT)).unwrap();
        let key = ["pddl_domain", "pddl_problem", "grammar"][which];
        let s = v[key].as_str().unwrap();
        let mut cut = cut.min(s.len());
        while !s.is_char_boundary(cut) { cut -= 1; }
        let mut v2 = v.clone();
        v2[key] = serde_json::Value::String(format!("{}{}{}", &s[..cut], junk, &s[cut..]));
        if let Ok(spec) = GameSpec::from_json_str(&v2.to_string(), "junk") {
            let mut e = AlfworldEnv::new(Arc::new(spec), 5);
            e.reset();
            for c in ["look", "go to shelf 1", "help"] { e.step(c); }
            let _ = e.expert_plan();
        }
    }
}

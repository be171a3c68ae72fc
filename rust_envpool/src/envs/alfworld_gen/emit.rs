//! Rendering a [`Game`] as the official `game.tw-pddl` JSON text: the PDDL problem laid out like
//! the ALFWorld problems (constants, instances, init sections, goal), the grammar with the task
//! sentence, and the walkthrough.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::scene::Game;
use super::vocab::{self, CLEAN, COOL, HEAT, PICK, RECOBJ, SLICE, TOGGLE};
use super::{TaskType, DOMAIN_PDDL, GRAMMAR_TEMPLATE};

// Goal formulas, laid out exactly as in the official problems of each task type.
const GOAL_PICK_AND_PLACE: &str = r#"        (:goal
            (and
                (exists (?r - receptacle)
                    (exists (?o - object)
                        (and
                            (inReceptacle ?o ?r)
                            (objectType ?o {OTYPE})
                            (receptacleType ?r {RTYPE})
                        )
                    )
                )
            )
        )
    )
    "#;
const GOAL_LOOK: &str = r#"        (:goal
             (and
                 (exists (?ot - object
                          ?r - receptacle
                          ?a - agent
                          ?l - location)
                     (and
                         (objectType ?ot {LTYPE})
                         (toggleable ?ot)
                         (isToggled ?ot)
                         (receptacleAtLocation ?r ?l)
                         (atLocation ?a ?l)
                         (inReceptacle ?ot ?r)
                     )
                 )
                 (exists (?o - object
                          ?a - agent)
                     (and
                         (objectType ?o {OTYPE})
                         (holds ?a ?o)
                     )
                 )
             )
        )
    )
    "#;
const GOAL_CLEAN: &str = r#"        (:goal
            (and
                (exists (?r - receptacle)
                    (exists (?o - object)
                        (and
                            (cleanable ?o)
                            (objectType ?o {OTYPE})
                            (receptacleType ?r {RTYPE})
                            (isClean ?o)
                            (inReceptacle ?o ?r)
                        )
                    )
                )
            )
        )
    )
    "#;
const GOAL_HEAT: &str = r#"        (:goal
            (and
                (exists (?r - receptacle)
                    (exists (?o - object)
                        (and
                            (heatable ?o)
                            (objectType ?o {OTYPE})
                            (receptacleType ?r {RTYPE})
                            (isHot ?o)
                            (inReceptacle ?o ?r)
                        )
                    )
                )
            )
        )
    )
    "#;
const GOAL_COOL: &str = r#"        (:goal
            (and
                (exists (?r - receptacle)
                    (exists (?o - object)
                        (and
                            (coolable ?o)
                            (objectType ?o {OTYPE})
                            (receptacleType ?r {RTYPE})
                            (isCool ?o)
                            (inReceptacle ?o ?r)
                        )
                    )
                )
            )
        )
    )
    "#;
const GOAL_TWO: &str = r#"                (:goal
                    (and
                        (exists (?r - receptacle)
                            (exists (?o1 - object)
                                (and
                                    (objectType ?o1 {OTYPE})
                                    (receptacleType ?r {RTYPE})
                                    (inReceptacle ?o1 ?r)
                                    (exists (?o2 - object)
                                        (and
                                            (not (= ?o1 ?o2))
                                            (objectType ?o2 {OTYPE})
                                            (receptacleType ?r {RTYPE})
                                            (inReceptacle ?o2 ?r)
                                        )
                                    )
                                )
                            )
                        )
                    )
                )
            )
            "#;

const INDENT: &str = "        ";

/// A JSON string literal as Python's `json.dumps` writes it for ASCII text.
fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings always serialize")
}

impl Game {
    /// The problem's name: `plan_` + a stable identifier of the generated game.
    pub fn problem_name(&self) -> String {
        format!(
            "plan_pcsd_gen_{}_{}_{}",
            self.task_type.as_str(),
            self.room.as_str(),
            self.seed
        )
    }

    /// The grammar text with this game's task sentence.
    pub fn grammar(&self) -> String {
        GRAMMAR_TEMPLATE.replace("{{TASK}}", &format!("Your task is to: {}.", self.task))
    }

    /// The PDDL problem text.
    pub fn pddl_problem(&self) -> String {
        let mut s = String::with_capacity(32 * 1024);
        let _ = write!(
            s,
            "\n(define (problem {})\n(:domain alfred)\n(:objects\nagent1 - agent\n",
            self.problem_name()
        );
        for (i, c) in vocab::OBJECT_CLASSES.iter().enumerate() {
            let _ = writeln!(s, "{}{c} - object", if i == 0 { "" } else { INDENT });
        }
        for (i, c) in vocab::OBJECT_CLASSES.iter().enumerate() {
            let _ = writeln!(s, "{}{c}Type - otype", if i == 0 { "" } else { INDENT });
        }
        for (i, c) in vocab::RECEPTACLE_CLASSES.iter().enumerate() {
            let _ = writeln!(s, "{}{c}Type - rtype", if i == 0 { "" } else { INDENT });
        }
        s.push_str("\n\n");
        let mut obj_ids: Vec<&str> = self.objects.iter().map(|o| o.id.as_str()).collect();
        obj_ids.sort_unstable();
        for id in obj_ids {
            let _ = writeln!(s, "{INDENT}{id} - object");
        }
        let mut rec_order: Vec<usize> = (0..self.receptacles.len()).collect();
        rec_order.sort_by(|&a, &b| self.receptacles[a].id.cmp(&self.receptacles[b].id));
        for &r in &rec_order {
            let _ = writeln!(s, "{INDENT}{} - receptacle", self.receptacles[r].id);
        }
        for l in &self.locations {
            let _ = writeln!(s, "{INDENT}{l} - location");
        }
        let _ = write!(s, "{INDENT})\n    \n\n(:init\n\n\n");

        let fact = |s: &mut String, body: String| {
            let _ = writeln!(s, "{INDENT}({body})");
        };
        for r in &self.receptacles {
            fact(&mut s, format!("receptacleType {} {}Type", r.id, r.class));
        }
        for o in &self.objects {
            fact(&mut s, format!("objectType {} {}Type", o.id, o.class));
        }
        // canContain for every receptacle class of the scene and every movable class present.
        let present: BTreeSet<&str> = self
            .objects
            .iter()
            .filter(|o| o.flags & PICK != 0)
            .map(|o| o.class)
            .collect();
        let mut seen_rclass = BTreeSet::new();
        for r in &self.receptacles {
            if !seen_rclass.insert(r.class) {
                continue;
            }
            for oc in vocab::rec_class(r.class)
                .contains
                .iter()
                .filter(|c| present.contains(*c))
            {
                fact(&mut s, format!("canContain {}Type {oc}Type", r.class));
            }
        }
        let flagged = |s: &mut String, pred: &str, bit: u8| {
            for o in self.objects.iter().filter(|o| o.flags & bit != 0) {
                let _ = writeln!(s, "{INDENT}({pred} {})", o.id);
            }
        };
        flagged(&mut s, "pickupable", PICK);
        flagged(&mut s, "isReceptacleObject", RECOBJ);
        for r in self.receptacles.iter().filter(|r| r.openable) {
            fact(&mut s, format!("openable {}", r.id));
        }
        let _ = write!(
            s,
            "{INDENT}\n{INDENT}(atLocation agent1 {})\n{INDENT}\n",
            self.locations[self.agent_location]
        );
        flagged(&mut s, "cleanable", CLEAN);
        let _ = writeln!(s, "{INDENT}");
        flagged(&mut s, "heatable", HEAT);
        flagged(&mut s, "coolable", COOL);
        let _ = writeln!(s, "{INDENT}");
        let _ = writeln!(s, "{INDENT}");
        flagged(&mut s, "toggleable", TOGGLE);
        let _ = writeln!(s, "{INDENT}");
        flagged(&mut s, "sliceable", SLICE);
        let _ = writeln!(s, "{INDENT}");
        for o in &self.objects {
            if let Some(r) = o.receptacle {
                fact(&mut s, format!("inReceptacle {} {}", o.id, self.receptacles[r].id));
            }
        }
        let _ = writeln!(s, "{INDENT}");
        let _ = writeln!(s, "{INDENT}");
        for &r in &rec_order {
            let rec = &self.receptacles[r];
            fact(
                &mut s,
                format!("receptacleAtLocation {} {}", rec.id, self.locations[rec.location]),
            );
        }
        for o in &self.objects {
            fact(
                &mut s,
                format!("objectAtLocation {} {}", o.id, self.locations[o.location]),
            );
        }
        let _ = write!(s, "{INDENT})\n    \n\n");

        let otype = format!("{}Type", self.target_class);
        let rtype = format!("{}Type", self.goal_class.unwrap_or(""));
        let goal = match self.task_type {
            TaskType::PickAndPlaceSimple => GOAL_PICK_AND_PLACE,
            TaskType::LookAtObjInLight => GOAL_LOOK,
            TaskType::PickCleanThenPlaceInRecep => GOAL_CLEAN,
            TaskType::PickHeatThenPlaceInRecep => GOAL_HEAT,
            TaskType::PickCoolThenPlaceInRecep => GOAL_COOL,
            TaskType::PickTwoObjAndPlace => GOAL_TWO,
        };
        let goal = goal
            .replace("{OTYPE}", &otype)
            .replace("{RTYPE}", &rtype)
            .replace("{LTYPE}", &format!("{}Type", vocab::DESK_LAMP.name));
        s.push_str(&goal);
        s
    }

    /// The complete `game.tw-pddl` text (JSON, keys in the official order, then `pcsd_gen` with
    /// the generation parameters).
    pub fn to_json(&self) -> String {
        let walkthrough: Vec<String> = self.walkthrough.iter().map(|c| json_str(c)).collect();
        format!(
            "{{\"pddl_domain\": {}, \"grammar\": {}, \"pddl_problem\": {}, \"solvable\": true, \"walkthrough\": [{}], \
             \"pcsd_gen\": {{\"task_type\": {}, \"seed\": {}, \"room\": {}, \"num_receptacles\": {}, \"num_distractors\": {}, \"task\": {}}}}}",
            json_str(DOMAIN_PDDL),
            json_str(&self.grammar()),
            json_str(&self.pddl_problem()),
            walkthrough.join(", "),
            json_str(self.task_type.as_str()),
            self.seed,
            json_str(self.room.as_str()),
            self.receptacles.len(),
            self.num_distractors,
            json_str(&self.task),
        )
    }
}

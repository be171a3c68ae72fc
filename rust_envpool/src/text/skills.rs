//! Privileged skill repository and keyword retrieval for the PCSD teacher.
//!
//! The skills are markdown files under `rust_envpool/skills/` embedded at compile time. They hold
//! procedural knowledge only (how a task type is solved in general), never instance answers.
//! Retrieval looks only at the task description: a deterministic keyword match picks the
//! task-type skills, and the environment's general rules are always included. A task that no
//! task type's keywords match gets the general rules only (the paper's appendix: "If no
//! task-type skill is matched, only the general skills are provided").

use std::fmt;
use std::str::FromStr;

use crate::text::error::PromptError;

/// Header and footer that delimit the skills in the teacher prompt.
pub const SKILL_HEADER: &str = "[Privileged Skill Information]";
/// See [`SKILL_HEADER`].
pub const SKILL_FOOTER: &str = "[End of Skill Information]";

/// Which benchmark a prompt or skill belongs to; `Text` is any other text environment (its
/// prompt from a template, its skills only from a user's folder: none built in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EnvKind {
    Alfworld,
    Webshop,
    Text,
}

impl EnvKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EnvKind::Alfworld => "alfworld",
            EnvKind::Webshop => "webshop",
            EnvKind::Text => "text",
        }
    }
}

impl fmt::Display for EnvKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EnvKind {
    type Err = PromptError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "alfworld" => Ok(EnvKind::Alfworld),
            "webshop" => Ok(EnvKind::Webshop),
            "text" => Ok(EnvKind::Text),
            _ => Err(PromptError::InvalidArgument {
                name: "env",
                expected: format!("'alfworld', 'webshop' or 'text', got {s:?}"),
            }),
        }
    }
}

/// The six ALFWorld task types (names as in the ALFWorld game directories).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlfworldTaskType {
    PickAndPlaceSimple,
    LookAtObjInLight,
    PickCleanThenPlaceInRecep,
    PickHeatThenPlaceInRecep,
    PickCoolThenPlaceInRecep,
    PickTwoObjAndPlace,
}

impl AlfworldTaskType {
    pub const ALL: [AlfworldTaskType; 6] = [
        AlfworldTaskType::PickAndPlaceSimple,
        AlfworldTaskType::LookAtObjInLight,
        AlfworldTaskType::PickCleanThenPlaceInRecep,
        AlfworldTaskType::PickHeatThenPlaceInRecep,
        AlfworldTaskType::PickCoolThenPlaceInRecep,
        AlfworldTaskType::PickTwoObjAndPlace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AlfworldTaskType::PickAndPlaceSimple => "pick_and_place_simple",
            AlfworldTaskType::LookAtObjInLight => "look_at_obj_in_light",
            AlfworldTaskType::PickCleanThenPlaceInRecep => "pick_clean_then_place_in_recep",
            AlfworldTaskType::PickHeatThenPlaceInRecep => "pick_heat_then_place_in_recep",
            AlfworldTaskType::PickCoolThenPlaceInRecep => "pick_cool_then_place_in_recep",
            AlfworldTaskType::PickTwoObjAndPlace => "pick_two_obj_and_place",
        }
    }

    /// The embedded skill text for this task type.
    pub fn skill(self) -> &'static str {
        match self {
            AlfworldTaskType::PickAndPlaceSimple => {
                include_str!("../../skills/alfworld/pick_and_place_simple.md")
            }
            AlfworldTaskType::LookAtObjInLight => {
                include_str!("../../skills/alfworld/look_at_obj_in_light.md")
            }
            AlfworldTaskType::PickCleanThenPlaceInRecep => {
                include_str!("../../skills/alfworld/pick_clean_then_place_in_recep.md")
            }
            AlfworldTaskType::PickHeatThenPlaceInRecep => {
                include_str!("../../skills/alfworld/pick_heat_then_place_in_recep.md")
            }
            AlfworldTaskType::PickCoolThenPlaceInRecep => {
                include_str!("../../skills/alfworld/pick_cool_then_place_in_recep.md")
            }
            AlfworldTaskType::PickTwoObjAndPlace => {
                include_str!("../../skills/alfworld/pick_two_obj_and_place.md")
            }
        }
    }
}

const ALFWORLD_GENERAL: &str = include_str!("../../skills/alfworld/general.md");
const WEBSHOP_GENERAL: &str = include_str!("../../skills/webshop/general.md");

/// WebShop product categories with their skill text and trigger words (lower-case, matched as
/// whole words of the task description).
const WEBSHOP_CATEGORIES: &[(&str, &str, &[&str])] = &[
    (
        "fashion",
        include_str!("../../skills/webshop/fashion.md"),
        &[
            "shirt",
            "shirts",
            "t-shirt",
            "dress",
            "dresses",
            "jeans",
            "pants",
            "shorts",
            "jacket",
            "coat",
            "hoodie",
            "sweater",
            "sweatshirt",
            "skirt",
            "shoes",
            "shoe",
            "sneakers",
            "sneaker",
            "boots",
            "sandals",
            "slippers",
            "socks",
            "leggings",
            "blouse",
            "tops",
            "bra",
            "underwear",
            "swimsuit",
            "hat",
            "cap",
            "belt",
            "clothing",
            "fit",
            "sleeve",
        ],
    ),
    (
        "beauty",
        include_str!("../../skills/webshop/beauty.md"),
        &[
            "shampoo",
            "conditioner",
            "lotion",
            "cream",
            "serum",
            "makeup",
            "lipstick",
            "mascara",
            "foundation",
            "perfume",
            "fragrance",
            "nail",
            "skin",
            "hair",
            "wig",
            "beauty",
            "moisturizer",
            "cleanser",
            "sunscreen",
            "deodorant",
            "toothpaste",
            "eyeshadow",
            "eyelash",
            "brush",
            "razor",
            "soap",
        ],
    ),
    (
        "electronics",
        include_str!("../../skills/webshop/electronics.md"),
        &[
            "charger",
            "cable",
            "usb",
            "headphones",
            "earbuds",
            "speaker",
            "bluetooth",
            "wireless",
            "phone",
            "iphone",
            "samsung",
            "laptop",
            "tablet",
            "camera",
            "tv",
            "monitor",
            "keyboard",
            "mouse",
            "battery",
            "hdmi",
            "adapter",
            "case",
            "screen",
            "router",
            "electronics",
        ],
    ),
    (
        "food",
        include_str!("../../skills/webshop/food.md"),
        &[
            "snack",
            "snacks",
            "coffee",
            "tea",
            "chocolate",
            "candy",
            "cookies",
            "chips",
            "sauce",
            "spice",
            "seasoning",
            "organic",
            "gluten",
            "keto",
            "vegan",
            "sugar",
            "protein",
            "drink",
            "juice",
            "nuts",
            "cereal",
            "food",
            "flavor",
            "jerky",
            "cheese",
        ],
    ),
    (
        "home",
        include_str!("../../skills/webshop/home.md"),
        &[
            "curtain",
            "curtains",
            "rug",
            "lamp",
            "table",
            "chair",
            "sofa",
            "couch",
            "bed",
            "pillow",
            "blanket",
            "sheets",
            "mattress",
            "shelf",
            "cabinet",
            "desk",
            "decor",
            "mirror",
            "towel",
            "furniture",
            "bedroom",
            "kitchen",
            "bathroom",
            "living",
            "storage",
            "candle",
            "vase",
        ],
    ),
];

/// Lower-case word tokens of a task description (letters, digits, '-' and '\'' kept inside words).
fn words(task: &str) -> Vec<String> {
    task.to_lowercase()
        .split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '\''))
        .filter(|w| !w.is_empty())
        .map(|w| w.to_string())
        .collect()
}

/// Task type of an ALFWorld task description by keyword matching (whole words, deterministic
/// priority: look > heat > cool > clean > two > pick-and-place), or `None` when no task type's
/// keywords occur. Pick-and-place has keywords of its own (a placing verb: "put", "place",
/// "move"); it is not the answer for an arbitrary text.
pub fn classify_alfworld_task(task: &str) -> Option<AlfworldTaskType> {
    let w = words(task);
    let has = |k: &str| w.iter().any(|x| x == k);
    let has_any = |ks: &[&str]| ks.iter().any(|k| has(k));
    let lamp = has_any(&["desklamp", "floorlamp", "lamp", "light"]);
    let looking = has("examine") || w.windows(2).any(|p| p[0] == "look" && p[1] == "at");
    if lamp || (looking && has_any(&["under", "with"])) {
        return Some(AlfworldTaskType::LookAtObjInLight);
    }
    if has_any(&["heat", "heated", "hot", "warm", "warmed"]) {
        return Some(AlfworldTaskType::PickHeatThenPlaceInRecep);
    }
    if has_any(&["cool", "cooled", "cold", "chill", "chilled"]) {
        return Some(AlfworldTaskType::PickCoolThenPlaceInRecep);
    }
    if has_any(&["clean", "cleaned", "wash", "washed", "rinse", "rinsed"]) {
        return Some(AlfworldTaskType::PickCleanThenPlaceInRecep);
    }
    if has_any(&["two", "2", "both", "pair"]) {
        return Some(AlfworldTaskType::PickTwoObjAndPlace);
    }
    if has_any(&PICK_AND_PLACE_KEYWORDS) {
        return Some(AlfworldTaskType::PickAndPlaceSimple);
    }
    None
}

/// The words that name a plain pick-and-place task ("put a mug in desk", "put some keychain on sofa").
pub const PICK_AND_PLACE_KEYWORDS: [&str; 3] = ["put", "place", "move"];

/// WebShop categories whose trigger words occur in the task (canonical order, possibly empty).
pub fn classify_webshop_task(task: &str) -> Vec<&'static str> {
    let w = words(task);
    WEBSHOP_CATEGORIES
        .iter()
        .filter(|(_, _, keys)| keys.iter().any(|k| w.iter().any(|x| x == k)))
        .map(|(name, _, _)| *name)
        .collect()
}

/// One retrieved skill: its name and markdown body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    pub name: &'static str,
    pub text: &'static str,
}

/// Skills for a task: the general rules first, then the matched task-type skills (none built in
/// for `Text`).
pub fn retrieve(task: &str, env: EnvKind) -> Vec<Skill> {
    match env {
        EnvKind::Text => Vec::new(),
        EnvKind::Alfworld => {
            let mut out = vec![Skill {
                name: "general",
                text: ALFWORLD_GENERAL,
            }];
            if let Some(t) = classify_alfworld_task(task) {
                out.push(Skill {
                    name: t.name(),
                    text: t.skill(),
                });
            }
            out
        }
        EnvKind::Webshop => {
            let mut out = vec![Skill {
                name: "general",
                text: WEBSHOP_GENERAL,
            }];
            for name in classify_webshop_task(task) {
                let (_, text, _) = WEBSHOP_CATEGORIES
                    .iter()
                    .find(|(n, _, _)| *n == name)
                    .expect("category names come from WEBSHOP_CATEGORIES");
                out.push(Skill { name, text });
            }
            out
        }
    }
}

/// The retrieved skills as one text block (without header/footer).
pub fn retrieve_text(task: &str, env: EnvKind) -> String {
    retrieve(task, env)
        .iter()
        .map(|s| s.text.trim_end())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The skill block placed before the student prompt in the teacher prompt; empty where no skill
/// is retrieved (`Text` without a user's folder: the teacher prompt is the student prompt).
pub fn skill_block(task: &str, env: EnvKind) -> String {
    if env == EnvKind::Text {
        return String::new();
    }
    format!("{SKILL_HEADER}\n{}\n{SKILL_FOOTER}\n\n", retrieve_text(task, env))
}

#[cfg(test)]
mod tests {
    use super::*;
    use AlfworldTaskType::*;

    #[test]
    fn alfworld_real_task_phrasings() {
        let cases = [
            ("put a clean mug in coffeemachine", PickCleanThenPlaceInRecep),
            ("clean some soapbar and put it in toilet", PickCleanThenPlaceInRecep),
            ("examine the book with the desklamp", LookAtObjInLight),
            ("look at alarmclock under the desklamp", LookAtObjInLight),
            ("examine the pillow with the floorlamp", LookAtObjInLight),
            ("put two spraybottle in toilet", PickTwoObjAndPlace),
            ("find two pillow and put them in sofa", PickTwoObjAndPlace),
            ("heat some egg and put it in countertop", PickHeatThenPlaceInRecep),
            ("put a hot potato in fridge", PickHeatThenPlaceInRecep),
            ("cool some apple and put it in fridge", PickCoolThenPlaceInRecep),
            ("put a cool tomato in microwave", PickCoolThenPlaceInRecep),
            ("put some keychain on sofa", PickAndPlaceSimple),
            ("put a tomato in microwave", PickAndPlaceSimple),
            ("Put A Clean Cloth In Cabinet.", PickCleanThenPlaceInRecep),
        ];
        for (task, want) in cases {
            assert_eq!(classify_alfworld_task(task), Some(want), "task {task:?}");
        }
    }

    #[test]
    fn whole_words_only() {
        // "tomato" contains "to", "two" must not match inside other words; "cooler" is not "cool".
        assert_eq!(
            classify_alfworld_task("put a tomato in cooler"),
            Some(PickAndPlaceSimple)
        );
        assert_eq!(
            classify_alfworld_task("put a twofold towel on shelf"),
            Some(PickAndPlaceSimple)
        );
        // "output" and "computer" hold "put" inside: no placing verb
        assert_eq!(classify_alfworld_task("the computer output"), None);
    }

    #[test]
    fn no_match_gives_general_skills_only() {
        for task in ["", "xyz", "go to the kitchen", "find a mug", "open the fridge"] {
            assert_eq!(classify_alfworld_task(task), None, "task {task:?}");
            let s = retrieve(task, EnvKind::Alfworld);
            assert_eq!(s.len(), 1, "task {task:?}");
            assert_eq!(s[0].name, "general");
            assert_eq!(retrieve_text(task, EnvKind::Alfworld), ALFWORLD_GENERAL.trim_end());
        }
        for kw in PICK_AND_PLACE_KEYWORDS {
            let task = format!("{kw} a mug in desk");
            assert_eq!(classify_alfworld_task(&task), Some(PickAndPlaceSimple), "task {task:?}");
            assert_eq!(retrieve(&task, EnvKind::Alfworld)[1].name, "pick_and_place_simple");
        }
    }

    #[test]
    fn general_skills_always_first() {
        for env in [EnvKind::Alfworld, EnvKind::Webshop] {
            let s = retrieve("something unrelated", env);
            assert_eq!(s[0].name, "general");
        }
        assert_eq!(retrieve("xyz", EnvKind::Webshop).len(), 1);
        let s = retrieve("heat some egg and put it in countertop", EnvKind::Alfworld);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].name, "pick_heat_then_place_in_recep");
        assert!(s[1].text.contains("microwave"));
    }

    #[test]
    fn webshop_categories() {
        let t = "i need a long sleeve men's shirt in navy, size large, and price lower than 40.00 dollars";
        assert_eq!(classify_webshop_task(t), vec!["fashion"]);
        let t = "i am looking for gluten free chocolate cookies, pack of 2";
        assert_eq!(classify_webshop_task(t), vec!["food"]);
        let t = "i want a wireless bluetooth speaker for my kitchen";
        assert_eq!(classify_webshop_task(t), vec!["electronics", "home"]);
    }

    #[test]
    fn deterministic_and_block_format() {
        let a = skill_block("cool some apple and put it in fridge", EnvKind::Alfworld);
        let b = skill_block("cool some apple and put it in fridge", EnvKind::Alfworld);
        assert_eq!(a, b);
        assert!(a.starts_with(SKILL_HEADER));
        assert!(a.trim_end().ends_with(SKILL_FOOTER));
        assert!(a.contains("fridge"));
    }

    #[test]
    fn env_parse() {
        assert_eq!("ALFWorld".parse::<EnvKind>().unwrap(), EnvKind::Alfworld);
        assert_eq!("text".parse::<EnvKind>().unwrap(), EnvKind::Text);
        assert!("sokoban".parse::<EnvKind>().is_err());
        assert!(retrieve("anything", EnvKind::Text).is_empty());
        assert_eq!(skill_block("anything", EnvKind::Text), "");
    }

    #[test]
    fn every_skill_nonempty() {
        for t in AlfworldTaskType::ALL {
            assert!(t.skill().len() > 50, "{}", t.name());
        }
    }
}

//! `webshop`: a native WebShop (princeton-nlp/WebShop's text environment, `observation_mode=
//! 'text'`), byte-identical to the original on its recorded episodes, without Java, pyserini,
//! spaCy or Flask.
//!
//! * [`Shop`]: one loaded shop — catalogue ([`catalog`]), search index ([`search`]), goals
//!   ([`goals`]), prices, the noun table of the reward ([`reward`]) — read-only behind an `Arc`,
//!   shared by any number of envs. What does not depend on the seed (the products, the index,
//!   the nouns) is one image ([`image`]), mapped from the index cache ([`cache`]) or built.
//! * [`WebShopEnv`]: one browser session on a shop: `reset(goal)`, `step(action)` with the
//!   original's action grammar and no-ops ([`pages`] renders the pages and their clickables).
//! * Where the original raises (`<a>` and bare `<c>` keywords, more than 1,024 distinct query
//!   terms, a page whose product was lost by a failed search), the step returns
//!   [`WebShopError::Step`] naming the original's exception; the env keeps the state the
//!   original keeps (the session changed by the search, the page not).
//! * Randomness the original takes from Python's global `random` after construction (`<r>`
//!   searches, the verl copy's auto-reset) comes from a per-env copy of that state, so one env
//!   replays a single-env process exactly; envs do not share it.

pub mod cache;
pub mod catalog;
pub mod expert;
pub mod fuzz;
pub mod goals;
pub mod image;
pub mod pages;
pub mod porter;
pub mod pyrandom;
pub mod pytext;
pub mod reward;
pub mod search;
pub mod slots;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use cache::{CachePolicy, CacheReport};
use catalog::{Catalog, CatalogBuilder, CatalogFiles, CatalogParts};
pub use catalog::{GoalOptions, Product};
pub use goals::{Goal, GoalRef, GoalSet};
use image::{Image, Invalid, Parts};
use pages::{SubPage, Target, View};
use pyrandom::PyRandom;
use reward::{NounParts, NounTable, RewardInfo};
use search::{Index, IndexBuilder, IndexParts, SearchError, SEARCH_RETURN_N};
use slots::{Placement, Slots};

use crate::envs::{EnvStep, TextEnv};

/// The original's base URL (pages are told apart by their URL).
const BASE_URL: &str = "http://127.0.0.1:3000";
/// Results per page.
const PRODUCT_WINDOW: usize = 10;

/// Errors of loading a shop or stepping an env.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WebShopError {
    /// A file could not be read or parsed.
    #[error("{0}")]
    Load(String),
    /// A bad argument: names the argument and what was expected.
    #[error("{0}")]
    Argument(String),
    /// The original raises here: `exception` is its exception type.
    #[error("{exception}: {msg}")]
    Step { exception: &'static str, msg: String },
}

/// Lucene's error for a query of more than 1,024 distinct terms.
fn lucene_err(e: SearchError) -> WebShopError {
    let SearchError::TooManyClauses(n) = e;
    step_err(
        "JavaException",
        format!(
            "JVM exception occurred: org.apache.lucene.search.IndexSearcher$TooManyClauses: maxClauseCount is set \
             to 1024 (query has {n} distinct terms)"
        ),
    )
}

fn step_err(exception: &'static str, msg: impl Into<String>) -> WebShopError {
    WebShopError::Step {
        exception,
        msg: msg.into(),
    }
}

/// Whose seeding and goal order a shop follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// princeton-nlp/WebShop: `random.seed(seed)` before construction (prices and price
    /// uppers), goals shuffled with `random.seed(233)`.
    Upstream,
    /// The verl-agent / SDAR copy: prices, uppers and shuffle all from `seed`; a finished
    /// episode auto-resets to a weight-sampled goal.
    Verl,
}

/// Where a shop's files are.
#[derive(Clone, Debug)]
pub struct ShopFiles {
    pub products: PathBuf,
    pub attributes: PathBuf,
    pub human_attributes: PathBuf,
    /// `spacy_nouns_1k.json`-shaped table of product-name nouns (`by_name`).
    pub nouns: PathBuf,
}

impl ShopFiles {
    /// The files under a data folder (`items_shuffle_1000.json`, ...) or a WebShop root holding
    /// `data/`; the noun table beside them (`spacy_nouns_1k.json`, `spacy_nouns.json` for the full
    /// set) or in the root's `facts/`.
    pub fn locate(dir: &Path) -> Result<ShopFiles, WebShopError> {
        // the 1k set the agent setups use, else the full set under its original names
        let sets = [
            ("items_shuffle_1000.json", "items_ins_v2_1000.json"),
            ("items_shuffle.json", "items_ins_v2.json"),
        ];
        let found = [dir.to_path_buf(), dir.join("data")]
            .into_iter()
            .flat_map(|d| sets.iter().map(move |s| (d.clone(), *s)))
            .find(|(d, (p, _))| d.join(p).is_file());
        let Some((data, (products_name, attrs_name))) = found else {
            return Err(WebShopError::Argument(format!(
                "data_dir: expected a folder holding items_shuffle_1000.json or items_shuffle.json (or a \
                 WebShop root with data/), got {}",
                dir.display()
            )));
        };
        let root = data.parent().map(Path::to_path_buf).unwrap_or_else(|| data.clone());
        // the noun table pcsd-data writes beside the set, else the 1k table of the shared facts/
        let table = if products_name == sets[0].0 {
            "spacy_nouns_1k.json"
        } else {
            "spacy_nouns.json"
        };
        let nouns = [data.join(table), root.join("facts").join("spacy_nouns_1k.json")]
            .into_iter()
            .find(|p| p.is_file())
            .unwrap_or_else(|| data.join(table));
        Ok(ShopFiles {
            products: data.join(products_name),
            attributes: data.join(attrs_name),
            human_attributes: data.join("items_human_ins.json"),
            nouns,
        })
    }
}

/// How a shop is built.
#[derive(Clone, Debug)]
pub struct ShopConfig {
    pub goals: GoalSet,
    pub seed: i64,
    pub variant: Variant,
    pub show_attrs: bool,
    /// Only the first N products of the file (the original's `num_products`).
    pub num_products: Option<usize>,
}

impl Default for ShopConfig {
    fn default() -> Self {
        ShopConfig {
            goals: GoalSet::Synthetic,
            seed: 0,
            variant: Variant::Upstream,
            show_attrs: false,
            num_products: None,
        }
    }
}

/// One loaded shop: read-only, shared by its envs.
#[derive(Debug)]
pub struct Shop {
    pub catalog: Catalog,
    /// `product_prices`, per product.
    pub prices: Vec<f64>,
    pub index: Index,
    /// The goals in play order, kept compact ([`Shop::goal`] makes one whole).
    pub goals: Vec<GoalRef>,
    /// `[0] + cumsum(weights)`.
    pub cum_weights: Vec<f64>,
    pub nouns: NounTable,
    pub config: ShopConfig,
    /// Where the image came from.
    pub cache: CacheReport,
    /// Python's global `random` state once construction is over.
    rng_after_load: PyRandom,
    /// Goals made recently ([`Shop::goal_shared`]) by goal index: a group of envs starts the
    /// same goal.
    recent_goals: Slots<Arc<StartedGoal>>,
    /// The goal-and-product parts of the rewards of recent purchases ([`Shop::reward`]) by
    /// [`reward_key`]: the envs of a group often buy the same product for the same goal.
    recent_rewards: Slots<RecentReward>,
}

/// What [`Shop::reward`] keeps per (goal index, product) in [`Shop::recent_rewards`]: the
/// goal-and-product parts, with the last options chosen for that pair and how many goal options
/// they matched.
#[derive(Debug)]
struct RecentReward {
    parts: reward::GoalProductParts,
    options: Vec<(String, String)>,
    n_opt: usize,
}

/// Slots of [`Shop::recent_rewards`].
const RECENT_REWARDS: usize = 4096;

/// The key of (goal, product) in [`Shop::recent_rewards`].
fn reward_key(goal: usize, product: usize) -> u64 {
    ((goal as u64) << 32) | product as u64
}

/// A goal as an env plays it: the goal and its search page (the page every reset to it shows).
#[derive(Debug)]
pub struct StartedGoal {
    /// The goal's index in its shop.
    pub index: usize,
    pub goal: Goal,
    /// `pages::render(&View::Search, ..)` of the goal's instruction.
    pub search_page: String,
    /// The URL of the search page of a reset to this goal (the session is the goal's index).
    pub url: String,
}

impl StartedGoal {
    fn new(index: usize, goal: Goal, search_page: String) -> StartedGoal {
        StartedGoal {
            index,
            goal,
            search_page,
            url: format!("{BASE_URL}/{index}"),
        }
    }
}

/// Slots of [`Shop::recent_goals`] (goal `i` is in set `i % (RECENT_GOALS / 2)`, of two slots).
const RECENT_GOALS: usize = 4096;

fn noun_err(path: &Path, e: String) -> WebShopError {
    WebShopError::Load(format!(
        "noun table {}: {e} (the reward's type score needs it)",
        path.display()
    ))
}

/// What a shop's image holds, built from the files.
struct ShopParts {
    catalog: CatalogParts,
    index: IndexParts,
    nouns: NounParts,
}

impl ShopParts {
    /// Streams the catalogue (the index is built as it streams in, a chunk of documents at a
    /// time), then reads the noun table.
    fn build(files: &ShopFiles, config: &ShopConfig) -> Result<ShopParts, WebShopError> {
        let mut builder = IndexBuilder::default();
        let mut chunk: Vec<String> = Vec::with_capacity(search::BUILD_CHUNK);
        let catalog = CatalogBuilder::stream(
            &CatalogFiles {
                products: files.products.clone(),
                attributes: files.attributes.clone(),
                human_attributes: files.human_attributes.clone(),
            },
            config.num_products,
            config.goals == GoalSet::Human,
            |_, doc| {
                chunk.push(doc);
                if chunk.len() == search::BUILD_CHUNK {
                    builder.add_chunk(std::mem::replace(&mut chunk, Vec::with_capacity(search::BUILD_CHUNK)));
                }
            },
        )?;
        builder.add_chunk(chunk);
        let index = builder.finish_parts(catalog.asin_ranks());
        let nouns = NounTable::load_parts(&files.nouns, catalog.view()).map_err(|e| noun_err(&files.nouns, e))?;
        Ok(ShopParts { catalog, index, nouns })
    }

    fn parts(&self) -> Parts<'_> {
        let mut p = Parts::new();
        self.catalog.add_to(&mut p);
        self.index.add_to(&mut p);
        self.nouns.add_to(&mut p);
        p
    }
}

impl Shop {
    /// Loads the catalogue, builds the index and the goals as the original's constructor does;
    /// everything is held in memory (no index cache: [`Shop::open`]).
    pub fn load(files: &ShopFiles, config: ShopConfig) -> Result<Shop, WebShopError> {
        Shop::open(files, config, &CachePolicy::Off)
    }

    /// [`Shop::load`] through the index cache: maps the image a previous load wrote when it is
    /// whole and was made from these files by this engine, else builds it and writes it (see
    /// [`cache`]); [`Shop::cache`] says what happened, with one line per thing to tell the user.
    pub fn open(files: &ShopFiles, config: ShopConfig, policy: &CachePolicy) -> Result<Shop, WebShopError> {
        Shop::open_in(files, config, &cache::folders(policy, files))
    }

    /// [`Shop::open`] with the cache looked for in `folders` in order and written in the first
    /// that takes it (none: held in memory, no cache).
    pub fn open_in(files: &ShopFiles, config: ShopConfig, folders: &[PathBuf]) -> Result<Shop, WebShopError> {
        if folders.is_empty() {
            let built = ShopParts::build(files, &config)?;
            let img = built
                .parts()
                .in_memory("")
                .map_err(|e| WebShopError::Load(format!("the shop's image in memory: {e}")))?;
            drop(built);
            return Shop::from_image(Arc::new(img), files, config, CacheReport::default());
        }
        let key = cache::key(files, config.goals, config.num_products)?;
        let name = cache::file_name(files, config.goals, config.num_products);
        let mut invalid: Vec<(PathBuf, Invalid)> = Vec::new();
        for dir in folders {
            let path = dir.join(&name);
            match image::open(&path, &key) {
                Ok(img) => {
                    let report = CacheReport {
                        path: Some(path.clone()),
                        hit: true,
                        notes: Vec::new(),
                    };
                    match Shop::from_image(Arc::new(img), files, config.clone(), report) {
                        Ok(shop) => return Ok(shop),
                        Err(e) => invalid.push((path, Invalid::Damaged(e.to_string()))),
                    }
                }
                Err(Invalid::Missing) => {}
                Err(e) => invalid.push((path, e)),
            }
        }
        let mut notes: Vec<String> = invalid
            .iter()
            .map(|(p, why)| format!("webshop: the index cache {} is {why}: rebuilding it", p.display()))
            .collect();
        let built = ShopParts::build(files, &config)?;
        let parts = built.parts();
        let mut failed: Vec<String> = Vec::new();
        let mut written = None;
        for dir in folders {
            let path = dir.join(&name);
            match cache::check_writable(dir).and_then(|_| parts.write_file(&path, &key)) {
                Ok(img) => {
                    if !failed.is_empty() {
                        notes.push(format!(
                            "webshop: cannot write the index cache in {}; it is in {}",
                            failed.join(", "),
                            path.display()
                        ));
                    }
                    written = Some((img, path));
                    break;
                }
                Err(e) => failed.push(format!("{} ({e})", dir.display())),
            }
        }
        let (img, path) = match written {
            Some((img, path)) => (img, Some(path)),
            None => {
                notes.push(format!(
                    "webshop: cannot write the index cache in {}: the index stays in memory and the next load \
                     builds it again (set WEBSHOP_CACHE to a writable folder)",
                    failed.join(", ")
                ));
                let img = parts
                    .in_memory(&key)
                    .map_err(|e| WebShopError::Load(format!("the shop's image in memory: {e}")))?;
                (img, None)
            }
        };
        drop(parts);
        drop(built);
        let report = CacheReport {
            path,
            hit: false,
            notes,
        };
        Shop::from_image(Arc::new(img), files, config, report)
    }

    /// The shop of an image: its catalogue, index and nouns, then the prices, goals and goal
    /// order the seed and variant give.
    fn from_image(
        img: Arc<Image>,
        files: &ShopFiles,
        config: ShopConfig,
        cache: CacheReport,
    ) -> Result<Shop, WebShopError> {
        let catalog = Catalog::from_image(img.clone(), &files.products)?;
        let index =
            Index::from_image(img.clone()).map_err(|e| WebShopError::Load(format!("the index's image: {e}")))?;
        let nouns = NounTable::from_image(img).map_err(|e| noun_err(&files.nouns, e))?;
        if index.num_docs() != catalog.len() {
            return Err(WebShopError::Load(format!(
                "the shop's image: {} documents for {} products",
                index.num_docs(),
                catalog.len()
            )));
        }
        let mut rng = PyRandom::new(config.seed as i128);
        let prices = catalog.prices(&mut rng);
        let mut goals = goals::build_goals(&catalog, &prices, config.goals, &mut rng);
        rng.seed(match config.variant {
            Variant::Upstream => 233,
            Variant::Verl => config.seed as i128,
        });
        rng.shuffle(&mut goals);
        let mut cum_weights = Vec::with_capacity(goals.len() + 1);
        cum_weights.push(0.0);
        let mut acc = 0.0;
        for g in &goals {
            acc += g.weight;
            cum_weights.push(acc);
        }
        Ok(Shop {
            catalog,
            prices,
            index,
            goals,
            cum_weights,
            nouns,
            config,
            cache,
            rng_after_load: rng,
            recent_goals: Slots::new(RECENT_GOALS, Placement::Direct),
            recent_rewards: Slots::new(RECENT_REWARDS, Placement::Hashed),
        })
    }

    pub fn num_goals(&self) -> usize {
        self.goals.len()
    }

    /// Goal `i` with its texts (the original's goal dict). Panics when out of range.
    pub fn goal(&self, i: usize) -> Goal {
        self.goals[i].goal(&self.catalog)
    }

    /// [`Shop::goal`] with its search page, shared: made once for the envs that start it about
    /// the same time.
    pub fn goal_shared(&self, i: usize) -> Arc<StartedGoal> {
        if let Some(g) = self.recent_goals.get(i as u64) {
            return g;
        }
        let goal = self.goal(i);
        let search_page = pages::render(
            &View::Search,
            &self.catalog,
            &goal.instruction_text,
            self.config.show_attrs,
        );
        let g = Arc::new(StartedGoal::new(i, goal, search_page));
        self.recent_goals.put(i as u64, g.clone());
        g
    }

    /// `get_reward` of buying product `product` at `price` with `options` for goal `goal_index`
    /// (`goal`: that goal): the type score and attribute matches kept per (goal, product) for
    /// the purchases made recently, with the goal options the last options chosen for that pair
    /// matched; the nouns read by index. [`reward::get_reward`] is the
    /// reference (a test compares both).
    pub fn reward(
        &self,
        goal_index: usize,
        goal: &Goal,
        product: usize,
        price: f64,
        options: &[(String, String)],
    ) -> Result<RewardInfo, reward::MissingNouns> {
        // the goal's product is known: its nouns by index (the title lookup is the reference)
        let gp = match self.goals.get(goal_index).map(|g| g.product as usize) {
            Some(gp) if self.catalog.product(gp).title() == goal.name => gp,
            _ => return reward::get_reward(&self.catalog, product, goal, price, options, &self.nouns),
        };
        let key = reward_key(goal_index, product);
        let kept = self
            .recent_rewards
            .with(key, |e| (e.parts, (e.options == options).then_some(e.n_opt)));
        match kept {
            Some((parts, Some(n_opt))) => Ok(reward::reward_from_counts(&parts, goal, price, n_opt)),
            Some((parts, None)) => {
                // the pair is kept: its last options become these
                let n_opt = reward::goal_options_matched(goal, options);
                self.recent_rewards.with(key, |e| {
                    e.options.clear();
                    e.options.extend_from_slice(options);
                    e.n_opt = n_opt;
                });
                Ok(reward::reward_from_counts(&parts, goal, price, n_opt))
            }
            None => {
                let parts = reward::goal_product_parts_of(&self.catalog, product, goal, gp, &self.nouns)?;
                let n_opt = reward::goal_options_matched(goal, options);
                self.recent_rewards.put(
                    key,
                    RecentReward {
                        parts,
                        options: options.to_vec(),
                        n_opt,
                    },
                );
                Ok(reward::reward_from_counts(&parts, goal, price, n_opt))
            }
        }
    }

    /// `get_top_n_product_from_keywords`: product indices.
    pub fn top_products(&self, keywords: &[String], rng: &mut PyRandom) -> Result<Vec<usize>, WebShopError> {
        let all = &self.catalog;
        match keywords.first().map(String::as_str) {
            Some("<r>") => {
                if all.len() < SEARCH_RETURN_N {
                    return Err(step_err("ValueError", "Sample larger than population or is negative"));
                }
                Ok(rng.sample_indices(all.len(), SEARCH_RETURN_N))
            }
            Some("<a>") => Err(step_err("TypeError", "'NoneType' object is not subscriptable")),
            Some("<c>") => {
                let cat = keywords
                    .get(1)
                    .ok_or_else(|| step_err("IndexError", "list index out of range"))?;
                let cat = pytext::py_strip(cat);
                Ok((0..all.len()).filter(|&i| all.product(i).category() == cat).collect())
            }
            Some("<q>") => {
                let q = keywords[1..].join(" ");
                let q = pytext::py_strip(&q);
                Ok((0..all.len()).filter(|&i| all.product(i).query() == q).collect())
            }
            _ => {
                let q = keywords.join(" ");
                let hits = self.index.search_top(&q).map_err(lucene_err)?;
                Ok(hits.into_iter().map(|(d, _)| d as usize).collect())
            }
        }
    }

    /// The hits of the exhaustive search (every matching posting scored: the reference of the
    /// pruned search [`Shop::top_products`] runs), product indices best first.
    pub fn search_reference(&self, query: &str) -> Result<Vec<usize>, WebShopError> {
        let (hits, _) = self.index.search(query).map_err(lucene_err)?;
        Ok(hits.into_iter().map(|(d, _)| d as usize).collect())
    }

    /// A new env on this shop (call [`WebShopEnv::reset`] before stepping).
    pub fn env(self: &Arc<Self>) -> WebShopEnv {
        WebShopEnv::new(self.clone())
    }
}

/// What one reset or step returns.
#[derive(Clone, Debug, PartialEq)]
pub struct WebShopStep {
    pub obs: String,
    pub reward: f64,
    /// The action was a no-op: the original returns the int 0 as reward.
    pub noop: bool,
    pub done: bool,
    pub has_search_bar: bool,
    pub clickables: Vec<String>,
    /// The page's URL in the original (tells pages apart).
    pub url: String,
    /// The reward's parts on a purchase.
    pub reward_info: Option<RewardInfo>,
}

/// `parse_action`: `re.match(r'(.+)\[(.+)\]', action)` (greedy, no newline inside the match).
pub fn parse_action(action: &str) -> (&str, Option<&str>) {
    let line = action.split('\n').next().unwrap_or("");
    let Some(r) = line.rfind(']') else {
        return (action, None);
    };
    // the last '[' with at least one char before it and one char before ']'
    let bytes = line.as_bytes();
    let mut i = r;
    while i > 0 {
        i -= 1;
        if bytes[i] == b'[' && i >= 1 && i + 1 < r {
            return (&line[..i], Some(&line[i + 1..r]));
        }
    }
    (action, None)
}

fn empty_goal() -> Goal {
    Goal {
        asin: String::new(),
        category: String::new(),
        query: String::new(),
        name: String::new(),
        product_category: String::new(),
        instruction_text: String::new(),
        attributes: Vec::new(),
        price_upper: 0.0,
        price_upper_is_int: false,
        goal_options: GoalOptions::List(Vec::new()),
        weight: 0.0,
        weight_is_int: false,
    }
}

/// One browser session on a shop.
pub struct WebShopEnv {
    shop: Arc<Shop>,
    rng: PyRandom,
    goal: usize,
    /// Goal `goal`, made when it started.
    goal_data: Arc<StartedGoal>,
    session_id: String,
    keywords: Option<Vec<String>>,
    page: Option<i64>,
    asin: Option<String>,
    options: Vec<(String, String)>,
    url: String,
    /// The page is the goal's search page (`goal_data.search_page`), not `obs`.
    obs_is_search_page: bool,
    view: View,
    clickables: Vec<(String, Target)>,
    has_search_bar: bool,
    obs: String,
    steps: usize,
    last_done: bool,
    /// The goal [`TextEnv::reset`] goes back to (the pool's group goal), whatever goal an
    /// auto-reset of the verl variant moved to.
    home: usize,
}

impl WebShopEnv {
    pub fn new(shop: Arc<Shop>) -> WebShopEnv {
        let rng = shop.rng_after_load.clone();
        let goal_data = if shop.goals.is_empty() {
            Arc::new(StartedGoal::new(0, empty_goal(), String::new()))
        } else {
            shop.goal_shared(0)
        };
        let mut env = WebShopEnv {
            shop,
            rng,
            goal: 0,
            goal_data,
            // room for the URLs of a reset (a fresh env's first reset then allocates nothing)
            session_id: String::with_capacity(16),
            keywords: None,
            page: None,
            asin: None,
            options: Vec::new(),
            url: String::with_capacity(64),
            obs_is_search_page: false,
            view: View::Search,
            clickables: Vec::new(),
            has_search_bar: true,
            obs: String::new(),
            steps: 0,
            last_done: false,
            home: 0,
        };
        if !env.shop.goals.is_empty() {
            env.start(0, None);
        }
        env
    }

    /// An env that plays goal `goal` (its [`TextEnv::reset`] goes back to it).
    pub fn with_goal(shop: Arc<Shop>, goal: usize) -> WebShopEnv {
        let mut env = WebShopEnv::new(shop);
        if goal < env.shop.goals.len() {
            env.start(goal, None);
            env.home = goal;
        }
        env
    }

    pub fn shop(&self) -> &Arc<Shop> {
        &self.shop
    }

    /// The goal being played.
    pub fn goal(&self) -> &Goal {
        &self.goal_data.goal
    }

    pub fn goal_index(&self) -> usize {
        self.goal
    }

    pub fn steps(&self) -> usize {
        self.steps
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// `reset(session=goal)`: the search page of goal `goal`.
    pub fn reset(&mut self, goal: usize) -> Result<WebShopStep, WebShopError> {
        if goal >= self.shop.goals.len() {
            return Err(WebShopError::Argument(format!(
                "goal_index: expected an int in [0, {}), got {goal}",
                self.shop.goals.len()
            )));
        }
        self.start(goal, None);
        Ok(self.snapshot(0.0, false, false, None))
    }

    /// [`WebShopEnv::reset`] without its [`WebShopStep`]: the page is left in the env
    /// ([`WebShopEnv::obs`], [`WebShopEnv::url`], [`WebShopEnv::clickable_names`]) for a caller
    /// that takes what it needs from there (the Python reset, which keeps a goal's reset page).
    pub fn reset_in_place(&mut self, goal: usize) -> Result<(), WebShopError> {
        if goal >= self.shop.goals.len() {
            return Err(WebShopError::Argument(format!(
                "goal_index: expected an int in [0, {}), got {goal}",
                self.shop.goals.len()
            )));
        }
        self.start(goal, None);
        Ok(())
    }

    /// [`WebShopEnv::reset_in_place`] with the goal at hand (`started`: goal `goal` of this
    /// env's shop, as [`WebShopEnv::started_goal`] gave it), not looked up in the shop.
    pub fn reset_started(&mut self, goal: usize, started: Arc<StartedGoal>) -> Result<(), WebShopError> {
        if goal >= self.shop.goals.len() || started.index != goal {
            return Err(WebShopError::Argument(format!(
                "goal_index: expected an int in [0, {}) with its own goal, got {goal} (goal {})",
                self.shop.goals.len(),
                started.index
            )));
        }
        self.goal_data = started;
        self.start(goal, None);
        Ok(())
    }

    /// The goal being played, with its search page.
    pub fn started_goal(&self) -> &Arc<StartedGoal> {
        &self.goal_data
    }

    /// The current page's observation.
    pub fn obs(&self) -> &str {
        if self.obs_is_search_page {
            &self.goal_data.search_page
        } else {
            &self.obs
        }
    }

    /// The current page rendered anew (the plain reference of [`WebShopEnv::obs`], which keeps
    /// the search page with the goal).
    pub fn render_current(&self) -> String {
        pages::render(
            &self.view,
            &self.shop.catalog,
            &self.goal().instruction_text,
            self.shop.config.show_attrs,
        )
    }

    /// The current page's clickables (what [`WebShopStep::clickables`] lists).
    pub fn clickable_names(&self) -> impl ExactSizeIterator<Item = &str> {
        self.clickables.iter().map(|(k, _)| k.as_str())
    }

    /// Whether the current page has the search bar.
    pub fn has_search_bar(&self) -> bool {
        self.has_search_bar
    }

    /// `reset()` without a session: a random session name and a weight-sampled goal
    /// (`random_idx(cum_weights)`), from the env's random state.
    pub fn reset_random(&mut self) -> WebShopStep {
        let letters: Vec<usize> = self.rng.choices_indices(26, 10);
        let session: String = letters.into_iter().map(|i| (b'a' + i as u8) as char).collect();
        let cw = &self.shop.cum_weights;
        let pos = self.rng.uniform(0.0, *cw.last().unwrap_or(&0.0));
        let idx = cw.partition_point(|&w| w <= pos).min(cw.len().saturating_sub(2));
        self.start(idx, Some(session));
        self.snapshot(0.0, false, false, None)
    }

    /// Starts goal `goal` in session `session` (None: the goal's index, as `reset(goal)` names it).
    fn start(&mut self, goal: usize, session: Option<String>) {
        use std::fmt::Write;
        if goal != self.goal_data.index || self.goal_data.goal.asin.is_empty() {
            self.goal_data = self.shop.goal_shared(goal);
        }
        self.goal = goal;
        match session {
            Some(s) => {
                self.session_id = s;
                self.url.clear();
                write!(self.url, "{BASE_URL}/{}", self.session_id).expect("a String takes it");
            }
            None => {
                // the session is the goal's index: the URL made with the goal
                self.url.clone_from(&self.goal_data.url);
                self.session_id.clear();
                self.session_id.push_str(&self.url[BASE_URL.len() + 1..]);
            }
        }
        self.keywords = None;
        self.page = None;
        self.asin = None;
        self.options.clear();
        self.steps = 0;
        self.last_done = false;
        self.show(View::Search);
    }

    fn show(&mut self, view: View) {
        let shop = &self.shop;
        // the search page is the goal's, made with it
        self.obs_is_search_page = view == View::Search;
        if !self.obs_is_search_page {
            self.obs = pages::render(
                &view,
                &shop.catalog,
                &self.goal().instruction_text,
                shop.config.show_attrs,
            );
        }
        self.has_search_bar = pages::clickables(&view, &shop.catalog, shop.config.show_attrs, &mut self.clickables);
        self.view = view;
    }

    fn snapshot(&self, reward: f64, noop: bool, done: bool, info: Option<RewardInfo>) -> WebShopStep {
        WebShopStep {
            obs: self.obs().to_string(),
            reward,
            noop,
            done,
            has_search_bar: self.has_search_bar,
            clickables: self.clickables.iter().map(|(k, _)| k.clone()).collect(),
            url: self.url.clone(),
            reward_info: info,
        }
    }

    /// The current observation and available actions.
    pub fn current(&self) -> WebShopStep {
        self.snapshot(0.0, false, false, None)
    }

    /// `get_page_name(current_url)`.
    fn page_name(&self) -> &'static str {
        for name in ["search_results", "item_page", "item_sub_page", "done"] {
            if self.url.contains(name) {
                return name;
            }
        }
        ""
    }

    fn keywords_url(&self) -> Result<String, WebShopError> {
        match &self.keywords {
            Some(k) => Ok(k.join("+")),
            None => Err(step_err("TypeError", "can only join an iterable")),
        }
    }

    fn product_of_session(&self) -> Result<usize, WebShopError> {
        let asin = self.asin.as_deref().ok_or_else(|| step_err("KeyError", "None"))?;
        self.shop
            .catalog
            .by_asin
            .get(asin)
            .copied()
            .ok_or_else(|| step_err("KeyError", format!("'{asin}'")))
    }

    /// `search_results(keywords, page)`.
    fn search_results(&mut self, keywords: Option<Vec<String>>, page: i64) -> Result<(), WebShopError> {
        let keywords = keywords.ok_or_else(|| step_err("AssertionError", "keywords is not a list"))?;
        self.page = Some(page);
        self.keywords = Some(keywords.clone());
        self.asin = None;
        self.options.clear();
        let shop = self.shop.clone();
        let top = shop.top_products(&keywords, &mut self.rng)?;
        let start = ((page - 1).max(0) as usize).saturating_mul(PRODUCT_WINDOW);
        let items: Vec<usize> = if page < 1 {
            // Python slicing with a negative start: not reachable through the page's buttons
            let lo = (page - 1) * PRODUCT_WINDOW as i64;
            let hi = page * PRODUCT_WINDOW as i64;
            let n = top.len() as i64;
            let norm = |x: i64| if x < 0 { (n + x).max(0) } else { x.min(n) };
            let (a, b) = (norm(lo), norm(hi));
            if a < b {
                top[a as usize..b as usize].to_vec()
            } else {
                Vec::new()
            }
        } else {
            top.iter().skip(start).take(PRODUCT_WINDOW).copied().collect()
        };
        self.url = format!(
            "{BASE_URL}/search_results/{}/{}/{page}",
            self.session_id,
            keywords.join("+")
        );
        self.show(View::Results {
            products: items,
            page,
            total: top.len(),
        });
        Ok(())
    }

    /// `item_page`: a product link sets the product, a radio sets an option.
    fn item_page(&mut self, name: &str, target: &Target) -> Result<(), WebShopError> {
        match target {
            Target::ProductLink(_) => self.asin = Some(name.to_uppercase()),
            Target::Radio { name: opt } => {
                let key = pytext::py_lower(opt);
                if let Some(slot) = self.options.iter_mut().find(|(k, _)| *k == key) {
                    slot.1 = name.to_string();
                } else {
                    self.options.push((key, name.to_string()));
                }
            }
            Target::Button => {}
        }
        let product = self.product_of_session()?;
        let kw = self.keywords_url()?;
        self.url = format!(
            "{BASE_URL}/item_page/{}/{}/{kw}/{}/{}",
            self.session_id,
            self.asin.as_deref().unwrap_or(""),
            self.page.map_or("None".to_string(), |p| p.to_string()),
            pytext::json_dumps_dict(&self.options)
        );
        self.show(View::Item { product });
        Ok(())
    }

    fn item_sub_page(&mut self, kind: SubPage) -> Result<(), WebShopError> {
        let product = self.product_of_session()?;
        let kw = self.keywords_url()?;
        self.url = format!(
            "{BASE_URL}/item_sub_page/{}/{}/{kw}/{}/{}/{}",
            self.session_id,
            self.asin.as_deref().unwrap_or(""),
            self.page.map_or("None".to_string(), |p| p.to_string()),
            kind.url_name(),
            pytext::py_dict_repr(&self.options)
        );
        self.show(View::Sub { kind, product });
        Ok(())
    }

    fn buy(&mut self) -> Result<RewardInfo, WebShopError> {
        let product = self.product_of_session()?;
        let shop = self.shop.clone();
        let goal = &self.goal_data.goal;
        let price = shop.prices[product];
        let info = shop
            .reward(self.goal, goal, product, price, &self.options)
            .map_err(|m| {
                step_err(
                    "KeyError",
                    format!("no noun-table entry for the product name {:?} (reward type score)", m.0),
                )
            })?;
        let asin = self.asin.clone().unwrap_or_default();
        self.url = format!(
            "{BASE_URL}/done/{}/{asin}/{}",
            self.session_id,
            pytext::py_dict_repr(&self.options)
        );
        self.show(View::Done {
            asin,
            options: self.options.clone(),
            reward: info.reward,
        });
        Ok(info)
    }

    /// `receive` for a click on `name` (a clickable of the current page).
    fn click(&mut self, name: &str, target: Target) -> Result<Option<RewardInfo>, WebShopError> {
        let page = self.page_name();
        match name {
            "buy now" => return self.buy().map(Some),
            "back to search" => {
                let session = self.session_id.clone();
                let goal = self.goal;
                let steps = self.steps;
                self.start(goal, Some(session));
                self.steps = steps;
            }
            "next >" if page == "search_results" => {
                let p = self
                    .page
                    .ok_or_else(|| step_err("TypeError", "unsupported operand type(s) for +: 'NoneType' and 'int'"))?;
                self.search_results(self.keywords.clone(), p + 1)?;
            }
            "< prev" if page == "search_results" => {
                let p = self
                    .page
                    .ok_or_else(|| step_err("TypeError", "unsupported operand type(s) for -: 'NoneType' and 'int'"))?;
                self.search_results(self.keywords.clone(), p - 1)?;
            }
            "< prev" if page == "item_sub_page" => self.item_page(name, &target)?,
            "< prev" if page == "item_page" => {
                let p = self.page.ok_or_else(|| step_err("TypeError", "page is None"))?;
                self.search_results(self.keywords.clone(), p)?;
            }
            _ => match SubPage::from_clickable(name) {
                Some(kind) => self.item_sub_page(kind)?,
                None => self.item_page(name, &target)?,
            },
        }
        Ok(None)
    }

    /// `step(action)`.
    pub fn step(&mut self, action: &str) -> Result<WebShopStep, WebShopError> {
        self.steps += 1;
        let (name, arg) = parse_action(action);
        let arg = arg.map(pytext::py_lower);
        let out = match (name, arg) {
            ("search", Some(q)) if !q.is_empty() => {
                let kw: Vec<String> = q.split(' ').map(str::to_string).collect();
                self.search_results(Some(kw), 1)?;
                self.snapshot(0.0, false, false, None)
            }
            ("click", Some(c)) if c != "search" && self.clickables.iter().any(|(k, _)| *k == c) => {
                let target = self
                    .clickables
                    .iter()
                    .find(|(k, _)| *k == c)
                    .map(|(_, t)| t.clone())
                    .expect("present");
                match self.click(&c, target)? {
                    Some(info) => self.snapshot(info.reward, false, true, Some(info)),
                    None => self.snapshot(0.0, false, false, None),
                }
            }
            _ => self.snapshot(0.0, true, false, None),
        };
        self.last_done = out.done;
        if out.done && self.shop.config.variant == Variant::Verl {
            // the verl copy resets inside step; the observation is the done page, the available
            // actions are the new episode's
            let obs = out.obs.clone();
            let url = out.url.clone();
            self.reset_random();
            let mut next = self.snapshot(out.reward, false, true, out.reward_info.clone());
            next.obs = obs;
            next.url = url;
            return Ok(next);
        }
        Ok(out)
    }
}

impl TextEnv for WebShopEnv {
    fn reset(&mut self) -> EnvStep {
        let g = self.home;
        let s = WebShopEnv::reset(self, g).expect("the env's own goal index is valid");
        to_env_step(s)
    }

    fn step(&mut self, command: &str) -> EnvStep {
        match WebShopEnv::step(self, command) {
            Ok(s) => to_env_step(s),
            Err(e) => EnvStep {
                obs: e.to_string(),
                done: true,
                ..EnvStep::default()
            },
        }
    }

    fn step_checked(&mut self, command: &str) -> Result<EnvStep, String> {
        WebShopEnv::step(self, command)
            .map(to_env_step)
            .map_err(|e| e.to_string())
    }

    fn task_type(&self) -> &str {
        "webshop"
    }

    fn task(&self) -> &str {
        &self.goal().instruction_text
    }
}

/// The pool's view of a step: admissible = clickables, score = reward, won = (done and reward
/// == 1.0).
fn to_env_step(s: WebShopStep) -> EnvStep {
    EnvStep {
        won: s.done && s.reward == 1.0,
        obs: s.obs,
        admissible: s.clickables,
        score: s.reward,
        done: s.done,
        has_search_bar: s.has_search_bar,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_cache;
#[cfg(test)]
mod tests_fast;

//! Tests against the original's recordings and tables under `$WEBSHOP_DATA` (the shared
//! `webshop/` folder); they skip with a message when it is unset, and fail under `CI=true`.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use super::*;

fn data_root() -> Option<PathBuf> {
    match std::env::var_os("WEBSHOP_DATA") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("WEBSHOP_DATA must be set under CI=true (the shared webshop/ folder)");
            }
            eprintln!("skipped: WEBSHOP_DATA is not set (the shared webshop/ folder)");
            None
        }
    }
}

fn gz_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(path)
        .output()
        .expect("gzip");
    assert!(out.status.success(), "gzip -dc {}", path.display());
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect()
}

fn shop(goals: GoalSet, seed: i64, variant: Variant) -> Option<Arc<Shop>> {
    shop_with(goals, seed, variant, false)
}

type ShopKey = (GoalSet, i64, Variant, bool);
type ShopCache = std::sync::Mutex<Vec<(ShopKey, Arc<Shop>)>>;

fn shop_with(goals: GoalSet, seed: i64, variant: Variant, show_attrs: bool) -> Option<Arc<Shop>> {
    static CACHE: OnceLock<ShopCache> = OnceLock::new();
    let root = data_root()?;
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock().unwrap();
    let key = (goals, seed, variant, show_attrs);
    if let Some((_, s)) = c.iter().find(|(k, _)| *k == key) {
        return Some(s.clone());
    }
    let files = ShopFiles::locate(&root).unwrap();
    let s = Arc::new(
        Shop::load(
            &files,
            ShopConfig {
                goals,
                seed,
                variant,
                show_attrs,
                num_products: None,
            },
        )
        .unwrap(),
    );
    c.push((key, s.clone()));
    Some(s)
}

#[test]
fn parse_action_follows_the_regex() {
    assert_eq!(parse_action("search[red shoes]"), ("search", Some("red shoes")));
    assert_eq!(parse_action("click[x] junk"), ("click", Some("x")));
    assert_eq!(parse_action("click[a]b]"), ("click", Some("a]b")));
    assert_eq!(parse_action("click[[x]]"), ("click[", Some("x]")));
    assert_eq!(parse_action("click[]"), ("click[]", None));
    assert_eq!(parse_action("[x]"), ("[x]", None));
    assert_eq!(parse_action("click[x\n]"), ("click[x\n]", None));
    assert_eq!(parse_action("search[a]\nclick[b]"), ("search", Some("a")));
    assert_eq!(parse_action("search"), ("search", None));
}

proptest::proptest! {
    /// `parse_action` against `re.match(r'(.+)\[(.+)\]', a)` run by a regex engine with the same
    /// leftmost-first, greedy semantics.
    #[test]
    fn parse_action_equals_the_regex(a in "[a-c\\[\\] \n\r]{0,12}") {
        let re = regex::Regex::new(r"^(.+)\[(.+)\]").unwrap();
        let want = match re.captures(&a) {
            Some(c) => (c.get(1).unwrap().as_str(), Some(c.get(2).unwrap().as_str())),
            None => (a.as_str(), None),
        };
        proptest::prop_assert_eq!(parse_action(&a), want);
    }
}

#[test]
fn documents_match_the_index_documents() {
    let Some(root) = data_root() else { return };
    let files = ShopFiles::locate(&root).unwrap();
    let cat = Catalog::load(
        &CatalogFiles {
            products: files.products,
            attributes: files.attributes,
            human_attributes: files.human_attributes,
        },
        None,
        false,
    )
    .unwrap();
    let f = std::fs::File::open(root.join("data/documents_1k.jsonl")).unwrap();
    let mut n = 0;
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        let p = &cat.products[i];
        assert_eq!(v["id"].as_str().unwrap(), p.asin);
        // the long texts read back from the file at the product's offset
        assert_eq!(v["contents"].as_str().unwrap(), cat.document(i), "doc {i}");
        let cold = cat.cold(i);
        assert_eq!(
            v["product"]["Description"].as_str().unwrap(),
            cold.description,
            "doc {i}"
        );
        let bullets: Vec<&str> = v["product"]["BulletPoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap())
            .collect();
        assert_eq!(bullets, cold.bullets, "doc {i}");
        n += 1;
    }
    assert_eq!(n, 1000);
}

#[test]
fn analyzer_matches_lucene_term_vectors() {
    let Some(root) = data_root() else { return };
    let docs = std::fs::read_to_string(root.join("data/documents_1k.jsonl")).unwrap();
    let terms = gz_lines(&root.join("facts/doc_terms_1k.jsonl.gz"));
    let mut bad = Vec::new();
    for (line, want) in docs.lines().zip(&terms) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let mut got: std::collections::BTreeMap<String, u64> = Default::default();
        let toks = search::analyze(v["contents"].as_str().unwrap());
        let len = toks.len() as u64;
        for t in toks {
            *got.entry(t).or_default() += 1;
        }
        let want_terms: std::collections::BTreeMap<String, u64> = want["terms"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect();
        if got != want_terms || len != want["length"].as_u64().unwrap() {
            let extra: Vec<_> = got.iter().filter(|(k, v)| want_terms.get(*k) != Some(v)).collect();
            let missing: Vec<_> = want_terms.iter().filter(|(k, v)| got.get(*k) != Some(v)).collect();
            bad.push(format!("{}: extra {:?} missing {:?}", want["asin"], extra, missing));
        }
    }
    assert!(
        bad.is_empty(),
        "{} docs differ:\n{}",
        bad.len(),
        bad[..bad.len().min(20)].join("\n")
    );
}

#[test]
fn search_matches_the_oracle() {
    let Some(shop) = shop(GoalSet::Synthetic, 0, Variant::Upstream) else {
        return;
    };
    let root = data_root().unwrap();
    let recs = gz_lines(&root.join("facts/search_oracle.jsonl.gz"));
    assert_eq!(shop.index.avgdl(), 107.608f32);
    let mut bad = Vec::new();
    let mut n = 0;
    for r in &recs {
        let q = r["query"].as_str().unwrap();
        if let Some(an) = r.get("analyzed") {
            let want: Vec<&str> = an.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
            let got = search::analyze(q);
            if got != want {
                bad.push(format!("analyze {q:?}: {got:?} != {want:?}"));
            }
        }
        let res = shop.index.search(q);
        match (r.get("hits"), res) {
            (Some(h), Ok((hits, matching))) => {
                let want: Vec<&str> = h.as_array().unwrap().iter().map(|x| x[0].as_str().unwrap()).collect();
                let got: Vec<&str> = hits
                    .iter()
                    .map(|(d, _)| shop.catalog.products[*d as usize].asin.as_str())
                    .collect();
                if got != want {
                    bad.push(format!(
                        "hits {q:?}: {:?} != {:?}",
                        &got[..got.len().min(5)],
                        &want[..want.len().min(5)]
                    ));
                }
                for ((_, s), w) in hits.iter().zip(h.as_array().unwrap()) {
                    let w = w[1].as_f64().unwrap();
                    if ((*s as f64 * 1e4).round() / 1e4 - w).abs() >= 1.5e-4 {
                        bad.push(format!("score {q:?}: {s} vs {w}"));
                        break;
                    }
                }
                if let Some(m) = r.get("n_matching_docs") {
                    assert_eq!(matching as u64, m.as_u64().unwrap(), "{q:?}");
                }
            }
            (None, Err(_)) => {
                assert!(
                    r["search_exception"].as_str().unwrap().contains("TooManyClauses"),
                    "{q:?}"
                );
            }
            (h, res) => bad.push(format!("{q:?}: oracle {:?} vs {:?}", h.is_some(), res.is_ok())),
        }
        n += 1;
    }
    assert!(n >= 1961);
    assert!(
        bad.is_empty(),
        "{} of {n} queries differ:\n{}",
        bad.len(),
        bad[..bad.len().min(20)].join("\n")
    );
}

#[test]
fn fuzz_matches_the_oracle() {
    let Some(root) = data_root() else { return };
    let recs = gz_lines(&root.join("facts/fuzz_oracle.jsonl.gz"));
    let mut bad = Vec::new();
    let arg = |v: &serde_json::Value| -> String {
        match v {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) => fuzz::FuzzArg::Pair(a[0].as_str().unwrap(), a[1].as_str().unwrap())
                .text()
                .into_owned(),
            _ => panic!("{v}"),
        }
    };
    for r in &recs {
        let got = fuzz::token_set_ratio(&arg(&r[0]), &arg(&r[1]));
        if got as u64 != r[2].as_u64().unwrap() {
            bad.push(format!("{} / {}: {got} != {}", r[0], r[1], r[2]));
        }
    }
    assert!(recs.len() > 1000);
    assert!(
        bad.is_empty(),
        "{} of {} differ:\n{}",
        bad.len(),
        recs.len(),
        bad[..bad.len().min(20)].join("\n")
    );
}

fn check_goals(file: &str, goals: GoalSet, seed: i64, variant: Variant) {
    let Some(shop) = shop(goals, seed, variant) else { return };
    let root = data_root().unwrap();
    let v = &gz_lines(&root.join("facts").join(file))[0];
    let want = v["goals"].as_array().unwrap();
    assert_eq!(shop.goals.len(), want.len());
    assert_eq!(shop.goals.len() as u64, v["n_goals"].as_u64().unwrap());
    let prices = v["product_prices"].as_object().unwrap();
    for (i, p) in shop.catalog.products.iter().enumerate() {
        assert_eq!(shop.prices[i], prices[&p.asin].as_f64().unwrap(), "price of {}", p.asin);
    }
    for (g, w) in (0..shop.num_goals()).map(|i| shop.goal(i)).zip(want) {
        assert_eq!(g.asin, w["asin"].as_str().unwrap());
        assert_eq!(g.instruction_text, w["instruction_text"].as_str().unwrap());
        assert_eq!(g.price_upper, w["price_upper"].as_f64().unwrap());
        assert_eq!(g.price_upper_is_int, w["price_upper"].is_u64());
        assert_eq!(
            g.weight,
            w["weight"].as_f64().unwrap(),
            "weight of {}",
            g.instruction_text
        );
        assert_eq!(g.name, w["name"].as_str().unwrap());
        assert_eq!(g.query, w["query"].as_str().unwrap());
        let attrs: Vec<&str> = w["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(g.attributes, attrs);
        let opts = &w["goal_options"];
        match &g.goal_options {
            GoalOptions::Dict(d) => {
                let o = opts.as_object().unwrap();
                assert_eq!(d.len(), o.len());
                for (k, val) in d {
                    assert_eq!(o[k].as_str().unwrap(), val);
                }
            }
            GoalOptions::List(l) => {
                let o: Vec<&str> = opts.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect();
                assert_eq!(*l, o);
            }
        }
    }
}

#[test]
fn goals_upstream_synthetic_seed0() {
    check_goals(
        "goals_upstream_synth_seed0.json.gz",
        GoalSet::Synthetic,
        0,
        Variant::Upstream,
    );
}

#[test]
fn goals_upstream_human_seed0() {
    check_goals(
        "goals_upstream_human_seed0.json.gz",
        GoalSet::Human,
        0,
        Variant::Upstream,
    );
}

#[test]
fn goals_verl_seed0_and_1000() {
    check_goals("goals_verl_seed0.json.gz", GoalSet::Synthetic, 0, Variant::Verl);
    check_goals("goals_verl_seed1000.json.gz", GoalSet::Synthetic, 1000, Variant::Verl);
}

fn avail(v: &serde_json::Value) -> (bool, Vec<String>) {
    (
        v["has_search_bar"].as_bool().unwrap(),
        v["clickables"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect(),
    )
}

/// Every step of the public traces through the engine: observation, available actions, reward
/// (value and int/float), done and URL equal; steps where the original raised raise here.
#[test]
fn replay_public_traces() {
    let Some(root) = data_root() else { return };
    let eps = gz_lines(&root.join("traces_public.jsonl.gz"));
    let mut bad: Vec<String> = Vec::new();
    let mut steps = 0;
    for ep in &eps {
        let cfg = ep["env_config"].as_str().unwrap();
        let seed = ep["env_seed"].as_i64().unwrap();
        let (goals, variant, attrs) = match cfg {
            "upstream_synth" => (GoalSet::Synthetic, Variant::Upstream, false),
            "upstream_human" => (GoalSet::Human, Variant::Upstream, false),
            "upstream_attrs" => (GoalSet::Synthetic, Variant::Upstream, true),
            "verl" => (GoalSet::Synthetic, Variant::Verl, false),
            c => panic!("config {c}"),
        };
        let shop = shop_with(goals, seed, variant, attrs).unwrap();
        let mut env = shop.env();
        let id = format!("{}#{}", ep["config"].as_str().unwrap(), ep["episode_id"]);
        let gi = ep["goal_index"].as_u64().unwrap() as usize;
        assert_eq!(
            env.shop().goal(gi).instruction_text,
            ep["goal"]["instruction_text"].as_str().unwrap(),
            "{id}"
        );
        let r = env.reset(gi).unwrap();
        let want = &ep["reset"];
        if r.obs != want["obs"].as_str().unwrap() {
            bad.push(format!("{id} reset obs"));
        }
        if (r.has_search_bar, r.clickables.clone()) != avail(&want["available_actions"]) {
            bad.push(format!("{id} reset avail"));
        }
        for st in ep["steps"].as_array().unwrap() {
            steps += 1;
            let a = st["action"].as_str().unwrap();
            let i = st["i"].as_u64().unwrap();
            let got = env.step(a);
            if let Some(exc) = st.get("exception") {
                match got {
                    Err(WebShopError::Step { exception, .. }) if exc.as_str().unwrap().starts_with(exception) => {}
                    other => bad.push(format!(
                        "{id} step {i} {a:?}: expected {exc}, got {:?}",
                        other.map(|s| s.obs)
                    )),
                }
                continue;
            }
            let got = match got {
                Ok(g) => g,
                Err(e) => {
                    bad.push(format!("{id} step {i} {a:?}: error {e}"));
                    break;
                }
            };
            let w_obs = st["obs"].as_str().unwrap();
            if got.obs != w_obs {
                let k = got.obs.chars().zip(w_obs.chars()).take_while(|(x, y)| x == y).count();
                let g: String = got.obs.chars().skip(k.saturating_sub(30)).take(90).collect();
                let w: String = w_obs.chars().skip(k.saturating_sub(30)).take(90).collect();
                bad.push(format!("{id} step {i} {a:?} obs:\n   got  {g:?}\n   want {w:?}"));
            }
            let wr = &st["reward"];
            if got.reward != wr.as_f64().unwrap() || got.noop != wr.is_u64() {
                bad.push(format!(
                    "{id} step {i} {a:?} reward {} (noop {}) != {wr}",
                    got.reward, got.noop
                ));
            }
            if got.done != st["done"].as_bool().unwrap() {
                bad.push(format!("{id} step {i} {a:?} done"));
            }
            if (got.has_search_bar, got.clickables.clone()) != avail(&st["available_actions"]) {
                bad.push(format!(
                    "{id} step {i} {a:?} avail {:?} != {}",
                    got.clickables, st["available_actions"]
                ));
            }
            if variant == Variant::Upstream && got.url != st["url"].as_str().unwrap() {
                bad.push(format!("{id} step {i} {a:?} url {} != {}", got.url, st["url"]));
            }
        }
    }
    assert_eq!(steps, 3364);
    assert!(
        bad.is_empty(),
        "{} differences in {steps} steps:\n{}",
        bad.len(),
        bad[..bad.len().min(30)].join("\n")
    );
}

/// `get_reward(..., verbose=True)` on the oracle's 7,565 (goal, product, options) cases.
#[test]
fn reward_matches_the_oracle() {
    let Some(shop) = shop(GoalSet::Synthetic, 0, Variant::Upstream) else {
        return;
    };
    let root = data_root().unwrap();
    let recs = gz_lines(&root.join("facts/reward_oracle.jsonl.gz"));
    let strs = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    };
    let pairs = |v: &serde_json::Value| -> Vec<(String, String)> {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, x)| (k.clone(), x.as_str().unwrap().to_string()))
            .collect()
    };
    let mut bad = Vec::new();
    for r in &recs {
        let g = &r["goal"];
        let goal = Goal {
            asin: g["asin"].as_str().unwrap().into(),
            category: String::new(),
            query: g["query"].as_str().unwrap().into(),
            name: g["name"].as_str().unwrap().into(),
            product_category: g["product_category"].as_str().unwrap().into(),
            instruction_text: String::new(),
            attributes: strs(&g["attributes"]),
            price_upper: g["price_upper"].as_f64().unwrap(),
            price_upper_is_int: g["price_upper"].is_u64(),
            goal_options: if g["goal_options"].is_array() {
                GoalOptions::List(strs(&g["goal_options"]))
            } else {
                GoalOptions::Dict(pairs(&g["goal_options"]))
            },
            weight: 1.0,
            weight_is_int: false,
        };
        let p = shop.catalog.by_asin[r["purchased_asin"].as_str().unwrap()];
        let info = reward::get_reward(
            &shop.catalog,
            p,
            &goal,
            r["price"].as_f64().unwrap(),
            &pairs(&r["options"]),
            &shop.nouns,
        )
        .unwrap();
        let w = &r["info"];
        let same = info.reward == r["reward"].as_f64().unwrap()
            && info.r_type == w["r_type"].as_f64().unwrap()
            && info.title_score == w["title_score"].as_f64().unwrap()
            && info.query_match == w["query_match"].as_bool().unwrap()
            && info.category_match == w["category_match"].as_bool().unwrap()
            && info.r_att == w["r_att"].as_f64().unwrap()
            && info.r_option == w.get("r_option").and_then(|x| x.as_f64())
            && info.r_price == w["r_price"].as_bool().unwrap();
        if !same {
            bad.push(format!(
                "{} {}: {:?} vs {} {}",
                r["goal_index"], r["case"], info, r["reward"], w
            ));
        }
    }
    assert_eq!(recs.len(), 7565);
    assert!(
        bad.is_empty(),
        "{} of {} differ:\n{}",
        bad.len(),
        recs.len(),
        bad[..bad.len().min(10)].join("\n")
    );
}

/// The expert reaches reward 1 on most synthetic goals within the paper's 15 steps.
#[test]
fn expert_solves_most_synthetic_goals() {
    let Some(shop) = shop(GoalSet::Synthetic, 0, Variant::Upstream) else {
        return;
    };
    let mut env = shop.env();
    let (mut won, mut total, mut max_steps) = (0, 0, 0);
    for g in (0..shop.num_goals()).step_by(23) {
        env.reset(g).unwrap();
        let mut last = None;
        let mut steps = 0;
        while let Some(a) = env.expert_action() {
            assert!(steps < 15, "goal {g}: expert still going after 15 steps");
            last = Some(env.step(&a).unwrap());
            steps += 1;
        }
        max_steps = max_steps.max(steps);
        let last = last.unwrap();
        assert!(last.done, "goal {g}");
        total += 1;
        won += (last.reward == 1.0) as usize;
    }
    eprintln!("expert: reward 1 on {won}/{total} synthetic goals, at most {max_steps} steps");
    assert!(won * 10 >= total * 8, "expert won only {won}/{total}");
}

/// The verl variant auto-resets to a weight-sampled goal on done (the available actions are the
/// new search page's); the pool's reset (`TextEnv::reset`) still goes back to the env's own goal.
#[test]
fn verl_auto_reset_and_pool_reset_goal() {
    let Some(shop) = shop(GoalSet::Synthetic, 0, Variant::Verl) else {
        return;
    };
    let mut env = WebShopEnv::with_goal(shop.clone(), 5);
    let mut last = None;
    while let Some(a) = env.expert_action() {
        let s = env.step(&a).unwrap();
        let done = s.done;
        last = Some(s);
        if done {
            break;
        }
    }
    let last = last.unwrap();
    assert!(last.done && last.obs.starts_with("Thank you for shopping with us!"));
    assert!(last.has_search_bar && last.clickables == vec!["search".to_string()]);
    assert!(env.url().starts_with("http://127.0.0.1:3000/") && env.url().len() == "http://127.0.0.1:3000/".len() + 10);
    let s = TextEnv::reset(&mut env);
    assert_eq!(env.goal_index(), 5);
    assert!(s.obs.contains(&shop.goal(5).instruction_text));
}

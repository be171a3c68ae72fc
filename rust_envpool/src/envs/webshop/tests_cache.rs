//! The index cache and the pruned search at the shop's level: a shop mapped from its cache file
//! equals the shop built in memory; a second load comes from the cache; a stale, foreign,
//! truncated or damaged cache is rebuilt with one line; a folder that cannot take the cache is
//! passed over with one line; the pruned search equals the exhaustive one on the 1k set.
//! Catalogues of a few products are written here; the 1k set comes from `$WEBSHOP_DATA`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;

/// A catalogue of `n` products (every third one a duplicate title, some ties in the index) in
/// `dir`, with its attribute, human-instruction and noun files.
fn write_catalogue(dir: &Path, n: usize) -> ShopFiles {
    let colours = ["red", "blue", "green"];
    let mut products = Vec::new();
    let mut attrs = serde_json::Map::new();
    let mut nouns = serde_json::Map::new();
    for i in 0..n {
        let asin = format!("B{:09}", (i * 7919) % 1_000_003);
        let name = format!("Cotton {} shirt {}", colours[i % 3], i / 3);
        products.push(serde_json::json!({
            "asin": asin,
            "name": name,
            "full_description": format!("A soft shirt made of cotton, number {i}."),
            "small_description": ["Machine wash", "Cotton"],
            "pricing": if i % 2 == 0 { "$10.00".to_string() } else { "$12.50 - $30.00".to_string() },
            "customization_options": {"Color": colours.iter().map(|c| serde_json::json!({"value": c, "image": null})).collect::<Vec<_>>(),
                                      "Size": [{"value": "Small", "image": null}, {"value": "Large", "image": null}]},
            "category": "fashion",
            "query": "shirts",
            "product_category": "Clothing › Shirts",
        }));
        attrs.insert(
            asin,
            serde_json::json!({"attributes": ["machine wash", "cotton"], "instruction": format!("i want a {} cotton shirt", colours[i % 3]),
                               "instruction_attributes": ["cotton"]}),
        );
        nouns.insert(name, serde_json::json!({"nouns": ["cotton", "shirt"]}));
    }
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("items_shuffle.json"),
        serde_json::to_string(&products).unwrap(),
    )
    .unwrap();
    std::fs::write(
        data.join("items_ins_v2.json"),
        serde_json::Value::Object(attrs).to_string(),
    )
    .unwrap();
    std::fs::write(data.join("items_human_ins.json"), "{}").unwrap();
    std::fs::write(
        data.join("spacy_nouns.json"),
        serde_json::json!({"by_name": serde_json::Value::Object(nouns)}).to_string(),
    )
    .unwrap();
    ShopFiles::locate(&data).unwrap()
}

fn config() -> ShopConfig {
    ShopConfig::default()
}

/// Everything an env shows on the expert's way through some goals, and the shop's goals,
/// prices and searches.
fn fingerprint(shop: &Arc<Shop>, queries: &[&str]) -> Vec<String> {
    let mut out = vec![format!("{:?}", shop.goals), format!("{:?}", shop.prices)];
    for q in queries {
        out.push(format!("{:?}", shop.index.search_top(q)));
    }
    let mut env = shop.env();
    for g in (0..shop.num_goals()).step_by((shop.num_goals() / 25).max(1)) {
        let r = env.reset(g).unwrap();
        out.push(r.obs);
        while let Some(a) = env.expert_action() {
            let s = env.step(&a).unwrap();
            out.push(format!("{} {} {:?} {:?}", s.obs, s.reward, s.clickables, s.reward_info));
            if s.done {
                break; // the verl variant has reset itself
            }
        }
        for sub in ["description", "features"] {
            if let Ok(s) = env.step(&format!("click[{sub}]")) {
                out.push(s.obs);
            }
        }
    }
    out
}

#[test]
fn a_cached_shop_equals_the_shop_built_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_catalogue(dir.path(), 60);
    let cache = dir.path().join("cache");
    let policy = CachePolicy::Dir(cache.clone());
    let first = Arc::new(Shop::open(&files, config(), &policy).unwrap());
    assert!(!first.cache.hit && first.cache.notes.is_empty(), "{:?}", first.cache);
    let path = first.cache.path.clone().unwrap();
    assert!(path.starts_with(&cache) && path.is_file());
    let second = Arc::new(Shop::open(&files, config(), &policy).unwrap());
    assert!(second.cache.hit && second.cache.notes.is_empty() && second.cache.path.as_ref() == Some(&path));
    let memory = Arc::new(Shop::load(&files, config()).unwrap());
    assert_eq!(memory.cache, CacheReport::default());
    let qs = ["red cotton shirt", "shirt", "blue", "large small", "nothing here"];
    let want = fingerprint(&memory, &qs);
    assert_eq!(fingerprint(&first, &qs), want);
    assert_eq!(fingerprint(&second, &qs), want);
    // another seed and variant read the same cache
    let verl = ShopConfig {
        seed: 3,
        variant: Variant::Verl,
        ..config()
    };
    let a = Arc::new(Shop::open(&files, verl.clone(), &policy).unwrap());
    assert!(a.cache.hit);
    assert_eq!(
        fingerprint(&a, &qs),
        fingerprint(&Arc::new(Shop::load(&files, verl).unwrap()), &qs)
    );
}

fn reopen(files: &ShopFiles, policy: &CachePolicy) -> CacheReport {
    Shop::open(files, config(), policy).unwrap().cache.clone()
}

#[test]
fn stale_foreign_truncated_and_damaged_caches_are_rebuilt_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_catalogue(dir.path(), 20);
    let policy = CachePolicy::Dir(dir.path().join("cache"));
    let path = reopen(&files, &policy).path.unwrap();
    let good = std::fs::read(&path).unwrap();
    let one_line = |r: &CacheReport, what: &str| {
        assert!(!r.hit, "{r:?}");
        assert_eq!(r.notes.len(), 1, "{r:?}");
        assert!(
            r.notes[0].contains(what) && r.notes[0].contains("rebuilding it") && !r.notes[0].contains('\n'),
            "{r:?}"
        );
        assert!(reopen(&files, &policy).hit, "rebuilt and written back");
    };
    // a byte of the body changed
    let mut bad = good.clone();
    let at = bad.len() - 100;
    bad[at] ^= 0x40;
    std::fs::write(&path, &bad).unwrap();
    one_line(&reopen(&files, &policy), "damaged (body checksum mismatch)");
    // cut short
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    one_line(&reopen(&files, &policy), "truncated");
    // not a cache
    std::fs::write(&path, b"[1, 2, 3]").unwrap();
    one_line(&reopen(&files, &policy), "foreign");
    // the catalogue changed: one more product
    let files = write_catalogue(dir.path(), 21);
    one_line(&reopen(&files, &policy), "stale (items_shuffle.json changed: size");
    // the noun table changed (same size, new contents and mtime)
    let table = std::fs::read_to_string(&files.nouns)
        .unwrap()
        .replace("shirt\"", "shirz\"");
    std::fs::write(&files.nouns, table).unwrap();
    one_line(&reopen(&files, &policy), "stale (spacy_nouns.json changed");
}

#[test]
fn a_named_pipe_at_the_cache_path_is_passed_over_with_one_line() {
    // opening a FIFO for reading waits for a writer: the load must not open it
    let dir = tempfile::tempdir().unwrap();
    let files = write_catalogue(dir.path(), 8);
    let policy = CachePolicy::Dir(dir.path().join("cache"));
    let path = reopen(&files, &policy).path.unwrap();
    std::fs::remove_file(&path).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(made.success());
    let r = reopen(&files, &policy);
    assert!(!r.hit && r.notes.len() == 1, "{r:?}");
    assert!(
        r.notes[0].contains("not a regular file but a named pipe") && r.notes[0].contains("rebuilding it"),
        "{r:?}"
    );
    assert!(
        std::fs::metadata(&path).unwrap().is_file(),
        "the cache written over the pipe"
    );
    assert!(reopen(&files, &policy).hit);
}

#[test]
fn the_cache_key_names_num_products() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_catalogue(dir.path(), 6);
    let all = cache::key(&files, GoalSet::Synthetic, None).unwrap();
    assert_ne!(all, cache::key(&files, GoalSet::Synthetic, Some(3)).unwrap());
    assert_ne!(
        cache::key(&files, GoalSet::Synthetic, Some(3)).unwrap(),
        cache::key(&files, GoalSet::Synthetic, Some(4)).unwrap()
    );
}

#[test]
fn folders_that_cannot_take_the_cache_are_passed_over_with_one_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let files = write_catalogue(dir.path(), 10);
    let data = files.products.parent().unwrap().to_path_buf();
    let user = dir.path().join("user-cache");
    // a read-only data folder (even for root): the next folder takes the cache
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o555)).unwrap();
    let folders = vec![data.clone(), user.clone()];
    let shop = Shop::open_in(&files, config(), &folders).unwrap();
    let r = &shop.cache;
    assert!(r.path.as_ref().unwrap().starts_with(&user), "{r:?}");
    assert_eq!(r.notes.len(), 1, "{r:?}");
    assert!(
        r.notes[0].contains("read-only folder") && r.notes[0].contains(&user.display().to_string()),
        "{r:?}"
    );
    assert_eq!(
        std::fs::read_dir(&data).unwrap().count(),
        4,
        "nothing written beside the data"
    );
    let again = Shop::open_in(&files, config(), &folders).unwrap();
    assert!(again.cache.hit && again.cache.notes.is_empty());
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    // no folder takes it (a file where the folder should be): kept in memory, one line
    let blocked = dir.path().join("a-file");
    std::fs::write(&blocked, b"x").unwrap();
    let shop = Shop::open(&files, config(), &CachePolicy::Dir(blocked.join("cache"))).unwrap();
    assert!(shop.cache.path.is_none() && !shop.cache.hit);
    assert_eq!(shop.cache.notes.len(), 1);
    assert!(shop.cache.notes[0].contains("stays in memory"), "{:?}", shop.cache);
    assert_eq!(shop.num_goals(), 10 * 6);
    // off: in memory, nothing said
    let off = Shop::open(&files, config(), &CachePolicy::Off).unwrap();
    assert_eq!(off.cache, CacheReport::default());
}

#[test]
fn human_goals_and_num_products_have_caches_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let files = write_catalogue(dir.path(), 12);
    let policy = CachePolicy::Dir(dir.path().join("cache"));
    let synth = Shop::open(&files, config(), &policy).unwrap();
    let first5 = ShopConfig {
        num_products: Some(5),
        ..config()
    };
    let five = Shop::open(&files, first5.clone(), &policy).unwrap();
    assert!(!five.cache.hit && five.cache.path != synth.cache.path);
    assert_eq!(five.catalog.len(), 5);
    assert!(Shop::open(&files, first5, &policy).unwrap().cache.hit);
    let human = ShopConfig {
        goals: GoalSet::Human,
        ..config()
    };
    let h = Shop::open(&files, human, &policy).unwrap();
    assert!(!h.cache.hit && h.num_goals() == 0);
    assert!(Shop::open(&files, config(), &policy).unwrap().cache.hit);
}

/// The 1k set: a shop mapped from its cache equals the one built in memory on the expert's
/// episodes, and the pruned search (window at a time, and document at a time) equals the
/// exhaustive one on every oracle query, goal instruction and product title.
#[test]
fn the_1k_set_from_its_cache_and_pruned_search_equal_the_reference() {
    let Some(root) = std::env::var_os("WEBSHOP_DATA").map(PathBuf::from) else {
        eprintln!("skipped: WEBSHOP_DATA is not set (the shared webshop/ folder)");
        return;
    };
    let files = ShopFiles::locate(&root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = CachePolicy::Dir(dir.path().to_path_buf());
    Shop::open(&files, config(), &policy).unwrap();
    let cached = Arc::new(Shop::open(&files, config(), &policy).unwrap());
    assert!(cached.cache.hit);
    let memory = Arc::new(Shop::load(&files, config()).unwrap());
    assert_eq!(fingerprint(&cached, &[]), fingerprint(&memory, &[]));
    let mut queries: Vec<String> = Vec::new();
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(root.join("facts/search_oracle.jsonl.gz"))
        .output()
        .unwrap();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        queries.push(v["query"].as_str().unwrap().to_string());
    }
    for i in 0..cached.num_goals() {
        queries.push(pytext::py_lower(&cached.goal(i).instruction_text));
    }
    for i in 0..cached.catalog.len() {
        queries.push(pytext::py_lower(cached.catalog.product(i).title()));
    }
    let (mut n, mut ties) = (0, 0);
    for q in &queries {
        let want = cached.index.search(q).map(|r| r.0);
        let got = cached.index.search_top(q);
        assert_eq!(got, want, "{q:?}");
        if let Ok(hits) = got {
            // the pruned paths themselves (small queries are scored in full by search_top)
            let counts = search::query_terms(q).unwrap();
            assert_eq!(cached.index.search_top_windowed(&counts), hits, "{q:?}");
            assert_eq!(cached.index.search_top_daat(&counts), hits, "{q:?}");
            n += 1;
            ties += hits.windows(2).filter(|w| w[0].1 == w[1].1).count();
        }
    }
    assert!(n >= 9_000 && ties > 1000, "{n} queries, {ties} ties");
}

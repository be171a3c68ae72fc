//! The fast paths of the pages and the reward against their plain references: the long texts
//! read through their spans ([`Catalog::cold`]) against the whole object parsed
//! ([`Catalog::cold_reference`]), on the 1k set and on products of every shape the file allows.

use super::*;

fn catalogue_of(dir: &Path, products: &str) -> Catalog {
    std::fs::write(dir.join("items.json"), products).unwrap();
    std::fs::write(dir.join("attrs.json"), "{}").unwrap();
    std::fs::write(dir.join("human.json"), "{}").unwrap();
    Catalog::load(
        &CatalogFiles {
            products: dir.join("items.json"),
            attributes: dir.join("attrs.json"),
            human_attributes: dir.join("human.json"),
        },
        None,
        false,
    )
    .unwrap()
}

#[test]
fn long_texts_through_their_spans_equal_the_whole_object_parsed() {
    let dir = tempfile::tempdir().unwrap();
    // null, missing, a string or a list; escapes, non-ASCII, keys in any order, white space
    // between tokens, fields after and before the ASIN, duplicate ASINs dropped
    let products = r#"[
      {"asin": "B1", "name": "a", "full_description": null, "small_description": null},
      {"name": "b", "asin": "B2"},
      { "small_description" : "one \"quoted\" line\n" , "asin" : "B3" , "name": "c", "full_description" : "caf\u00e9 \\ x" },
      {"full_description": "déjà vu 🙂", "images": ["x", {"y": [1, 2]}], "asin": "B4", "name": "d",
       "small_description": ["first", "", "  third  "], "pricing": "$1.00"},
      {"asin": "B4", "name": "duplicate", "full_description": "dropped"},
      {"asin": "B\u0035", "name": "e", "small_description": [], "full_description": ""}
    ]"#;
    let cat = catalogue_of(dir.path(), products);
    assert_eq!(cat.len(), 5);
    for i in 0..cat.len() {
        assert_eq!(cat.cold(i), cat.cold_reference(i), "product {i}");
    }
    assert_eq!(
        cat.cold(0),
        catalog::Cold {
            description: String::new(),
            bullets: vec![String::new()]
        }
    );
    assert_eq!(cat.cold(1), cat.cold(0));
    assert_eq!(cat.cold(2).description, "café \\ x");
    assert_eq!(cat.cold(2).bullets, vec!["one \"quoted\" line\n".to_string()]);
    assert_eq!(cat.cold(3).bullets, vec!["first", "", "  third  "]);
    assert_eq!(cat.product(4).asin(), "B5");
    assert!(cat.cold(4).bullets.is_empty());
}

#[test]
fn a_changed_catalogue_file_is_named_when_a_long_text_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let cat = catalogue_of(dir.path(), r#"[{"asin": "B1", "name": "a", "full_description": "x"}]"#);
    std::fs::write(
        dir.path().join("items.json"),
        r#"[{"asin": "B9", "name": "a", "full_description": "x"}]"#,
    )
    .unwrap();
    let err = std::panic::catch_unwind(|| cat.cold(0)).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("the catalogue file changed while the shop was loaded"),
        "{msg}"
    );
}

/// The 1k set's shop with these goals (None, with a message, when `$WEBSHOP_DATA` is unset).
fn shop_1k(goals: GoalSet) -> Option<Shop> {
    shop_1k_with(ShopConfig {
        goals,
        ..ShopConfig::default()
    })
}

/// The 1k set's shop with this configuration (None when `$WEBSHOP_DATA` is unset).
fn shop_1k_with(config: ShopConfig) -> Option<Shop> {
    let Some(root) = std::env::var_os("WEBSHOP_DATA").map(PathBuf::from) else {
        eprintln!("skipped: WEBSHOP_DATA is not set (the shared webshop/ folder)");
        return None;
    };
    let files = ShopFiles::locate(&root).unwrap();
    Some(Shop::load(&files, config).unwrap())
}

#[test]
fn long_texts_of_the_1k_set_through_their_spans_equal_the_reference() {
    let Some(shop) = shop_1k(GoalSet::Synthetic) else {
        return;
    };
    let cat = &shop.catalog;
    for i in 0..cat.len() {
        assert_eq!(cat.cold(i), cat.cold_reference(i), "product {i}");
    }
    // kept for the products read recently: the same texts, read or kept
    for _ in 0..2 {
        for i in 0..cat.len() {
            assert_eq!(*cat.cold_shared(i), cat.cold_reference(i), "product {i}");
        }
    }
}

#[test]
fn the_reward_with_nouns_by_index_equals_the_reward_by_title() {
    for goals in [GoalSet::Synthetic, GoalSet::Human] {
        let Some(shop) = shop_1k(goals) else { return };
        let cat = &shop.catalog;
        let mut checked = 0;
        for (g, r) in shop.goals.iter().enumerate() {
            let goal = shop.goal(g);
            let gp = r.product as usize;
            // the goal's product with its options and none, and two other products
            let options: Vec<(String, String)> = match &goal.goal_options {
                GoalOptions::Dict(d) => d.clone(),
                GoalOptions::List(l) => l.iter().map(|v| ("o".to_string(), v.clone())).collect(),
            };
            for (product, opts) in [
                (gp, &options[..]),
                (gp, &[][..]),
                ((gp + 1) % cat.len(), &options[..]),
                ((gp * 7 + 3) % cat.len(), &[][..]),
            ] {
                let price = shop.prices[product];
                let want = reward::get_reward(cat, product, &goal, price, opts, &shop.nouns);
                let got = reward::get_reward_of(cat, product, &goal, gp, price, opts, &shop.nouns);
                // Debug text: a goal without attributes gives NaN parts
                assert_eq!(format!("{got:?}"), format!("{want:?}"), "goal {g}, product {product}");
                // the shop's reward, made and then kept (the same pair bought again)
                for _ in 0..2 {
                    let kept = shop.reward(g, &goal, product, price, opts);
                    assert_eq!(format!("{kept:?}"), format!("{want:?}"), "goal {g}, product {product}");
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 4 * shop.num_goals());
        assert!(checked >= 40, "{checked}");
    }
}

/// The rewards a shop keeps per (goal, product) and last options chosen: purchases of the same
/// pairs with other options, in an order that takes slots over, equal the plain `get_reward`.
#[test]
fn the_rewards_kept_per_goal_and_product_equal_the_plain_reward() {
    let Some(shop) = shop_1k(GoalSet::Synthetic) else {
        return;
    };
    let cat = &shop.catalog;
    let mut rng = PyRandom::new(7);
    let mut checked = 0;
    for _ in 0..3000 {
        let g = rng.sample_indices(shop.num_goals().min(300), 1)[0];
        let goal = shop.goal(g);
        let gp = shop.goals[g].product as usize;
        let product = if rng.sample_indices(2, 1)[0] == 0 {
            gp
        } else {
            rng.sample_indices(cat.len(), 1)[0]
        };
        // the goal's options, a subset of them, or one of the product's values
        let mut opts: Vec<(String, String)> = match &goal.goal_options {
            GoalOptions::Dict(d) => d.clone(),
            GoalOptions::List(l) => l.iter().map(|v| ("o".to_string(), v.clone())).collect(),
        };
        match rng.sample_indices(3, 1)[0] {
            0 => {}
            1 => opts.truncate(opts.len() / 2),
            _ => {
                opts.clear();
                if let Some((name, values)) = cat.product(product).options().next() {
                    if let Some(v) = values.iter().next() {
                        opts.push((name.to_string(), v.to_string()));
                    }
                }
            }
        }
        let price = shop.prices[product];
        let want = reward::get_reward(cat, product, &goal, price, &opts, &shop.nouns);
        let got = shop.reward(g, &goal, product, price, &opts);
        assert_eq!(
            format!("{got:?}"),
            format!("{want:?}"),
            "goal {g}, product {product}, {opts:?}"
        );
        checked += 1;
    }
    assert_eq!(checked, 3000);
}

/// The page an env keeps (the goal's search page kept with the goal, the other pages rendered
/// when shown) is the page rendered anew, through resets to goals sharing a kept set and the
/// expert's episodes; a reset with the goal at hand equals one that looks it up.
#[test]
fn the_kept_search_page_equals_the_page_rendered_anew() {
    for show_attrs in [false, true] {
        let Some(shop) = shop_1k_with(ShopConfig {
            show_attrs,
            ..ShopConfig::default()
        }) else {
            return;
        };
        let shop = Arc::new(shop);
        let n = shop.num_goals();
        let mut env = shop.env();
        let mut other = shop.env();
        // three goals of one set of two (the third pushes one out), and others
        let set = RECENT_GOALS / 2;
        for g in [
            0,
            set % n,
            (2 * set) % n,
            1,
            0,
            n - 1,
            (n - 1 + set) % n,
            (n - 1 + 2 * set) % n,
            7,
        ] {
            let s = env.reset(g).unwrap();
            assert_eq!(s.obs, env.render_current(), "goal {g}");
            assert_eq!(env.obs(), s.obs);
            other.reset_started(g, env.started_goal().clone()).unwrap();
            assert_eq!(other.current(), env.current(), "goal {g}");
            assert_eq!(other.goal(), &shop.goal(g));
            // the expert's episode: every page as rendered anew
            for _ in 0..12 {
                let Some(a) = env.expert_action() else { break };
                let s = env.step(&a).unwrap();
                assert_eq!(s.obs, env.render_current(), "goal {g}, {a}");
            }
            // another goal's kept goal is refused
            assert!(other.reset_started((g + 1) % n, env.started_goal().clone()).is_err());
        }
    }
}

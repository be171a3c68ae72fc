//! The pages as `observation_mode='text'` shows them (the text nodes of the original's Flask
//! templates after bs4's `html.parser`, stripped and joined with ` [SEP] `) and their clickables
//! (`.btn` texts lower-cased, product-link ASINs lower-cased, radio values; a dict, so a
//! repeated key keeps its first slot and its last element).

use super::catalog::Catalog;
use super::pytext::{flask_tojson_dict, py_float_repr, py_lower, py_strip};

pub const SEP: &str = " [SEP] ";

/// Which sub-page of an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubPage {
    Description,
    Features,
    Reviews,
    Attributes,
}

impl SubPage {
    /// The clickable (lower-cased button text) that opens it.
    pub fn from_clickable(s: &str) -> Option<SubPage> {
        match s {
            "description" => Some(SubPage::Description),
            "features" => Some(SubPage::Features),
            "reviews" => Some(SubPage::Reviews),
            "attributes" => Some(SubPage::Attributes),
            _ => None,
        }
    }

    /// The name in the page's URL (`ACTION_TO_TEMPLATE` key).
    pub fn url_name(self) -> &'static str {
        match self {
            SubPage::Description => "Description",
            SubPage::Features => "Features",
            SubPage::Reviews => "Reviews",
            SubPage::Attributes => "Attributes",
        }
    }
}

/// The page a browser shows.
#[derive(Clone, Debug, PartialEq)]
pub enum View {
    Search,
    Results {
        products: Vec<usize>,
        page: i64,
        total: usize,
    },
    Item {
        product: usize,
    },
    Sub {
        kind: SubPage,
        product: usize,
    },
    Done {
        asin: String,
        options: Vec<(String, String)>,
        reward: f64,
    },
}

/// What a clickable is in the page.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// A `.btn` button.
    Button,
    /// A product link (its product index).
    ProductLink(usize),
    /// A radio input: its `name` attribute (the option name).
    Radio { name: String },
}

/// One text node as bs4 hands it to the text conversion: a node of ASCII whitespace only
/// becomes `'\n'` (dropped) if it holds a newline, else `' '` (an empty segment); others are
/// stripped.
fn push_node(out: &mut Vec<String>, text: &str) {
    if text.is_empty() {
        return;
    }
    if text
        .bytes()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c'))
    {
        if !text.contains('\n') {
            out.push(String::new());
        }
        return;
    }
    out.push(py_strip(text).to_string());
}

fn head(out: &mut Vec<String>, instruction: &str) {
    out.push("Instruction:".into());
    push_node(out, instruction);
    out.push("Back to Search".into());
}

/// The observation text of a view.
pub fn render(view: &View, catalog: &Catalog, instruction: &str, show_attrs: bool) -> String {
    let mut s: Vec<String> = Vec::new();
    match view {
        View::Search => {
            s.push("WebShop".into());
            s.push("Instruction:".into());
            push_node(&mut s, instruction);
            s.push("Search".into());
        }
        View::Results {
            products: items,
            page,
            total,
        } => {
            head(&mut s, instruction);
            s.push(format!("Page {page} (Total results: {total})"));
            if *page > 1 {
                s.push("< Prev".into());
            }
            s.push("Next >".into());
            for &i in items {
                let p = catalog.product(i);
                push_node(&mut s, p.asin());
                push_node(&mut s, p.title());
                push_node(&mut s, p.price_tag());
            }
        }
        View::Item { product } => {
            let p = catalog.product(*product);
            head(&mut s, instruction);
            s.push("< Prev".into());
            for (name, values) in p.options() {
                push_node(&mut s, name);
                for v in values {
                    push_node(&mut s, v);
                }
            }
            push_node(&mut s, p.title());
            push_node(&mut s, &format!("Price: {}", p.price_tag()));
            s.push("Rating: N.A.".into());
            s.push("Description".into());
            s.push("Features".into());
            s.push("Reviews".into());
            if show_attrs {
                s.push("Attributes".into());
            }
            s.push("Buy Now".into());
        }
        View::Sub { kind, product } => {
            let p = catalog.product(*product);
            head(&mut s, instruction);
            s.push("< Prev".into());
            match kind {
                SubPage::Description => push_node(&mut s, &catalog.cold_shared(*product).description),
                SubPage::Features => {
                    for b in &catalog.cold_shared(*product).bullets {
                        push_node(&mut s, &format!(" {b}"));
                    }
                }
                SubPage::Reviews => {}
                SubPage::Attributes => {
                    for a in p.attributes() {
                        push_node(&mut s, &format!(" {a}"));
                    }
                    push_node(&mut s, p.category());
                    push_node(&mut s, p.query());
                    push_node(&mut s, p.product_category());
                }
            }
        }
        View::Done { asin, options, reward } => {
            return format!(
                "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk \
                 interface.) [SEP] Purchased [SEP] asin [SEP] {asin} [SEP] options [SEP] {} [SEP] attrs [SEP] \
                 None [SEP] category [SEP] None [SEP] query [SEP] None [SEP] product category [SEP] None [SEP] \
                 Target [SEP] asin [SEP] options [SEP] attrs [SEP] price upper [SEP] instuction text [SEP] \
                 category [SEP] product category [SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] Your \
                 score (min 0.0, max 1.0) [SEP] {} [SEP] Reward Details [SEP] None",
                flask_tojson_dict(options),
                py_float_repr(*reward)
            );
        }
    }
    s.join(SEP)
}

fn insert(out: &mut Vec<(String, Target)>, key: String, target: Target) {
    if let Some(slot) = out.iter_mut().find(|(k, _)| *k == key) {
        slot.1 = target;
    } else {
        out.push((key, target));
    }
}

/// The clickables of a view, in the original's order, into `out` (cleared first; its room is
/// reused); whether the view has the search bar.
pub fn clickables(view: &View, catalog: &Catalog, show_attrs: bool, out: &mut Vec<(String, Target)>) -> bool {
    out.clear();
    let btn = |out: &mut Vec<(String, Target)>, t: &str| insert(out, t.to_string(), Target::Button);
    match view {
        View::Search => {
            btn(out, "search");
            return true;
        }
        View::Results {
            products: items, page, ..
        } => {
            btn(out, "back to search");
            if *page > 1 {
                btn(out, "< prev");
            }
            btn(out, "next >");
            for &i in items {
                insert(out, py_lower(catalog.product(i).asin()), Target::ProductLink(i));
            }
        }
        View::Item { product } => {
            for b in ["back to search", "< prev", "description", "features", "reviews"] {
                btn(out, b);
            }
            if show_attrs {
                btn(out, "attributes");
            }
            btn(out, "buy now");
            for (name, values) in catalog.product(*product).options() {
                for v in values {
                    insert(out, v.to_string(), Target::Radio { name: name.to_string() });
                }
            }
        }
        View::Sub { .. } => {
            btn(out, "back to search");
            btn(out, "< prev");
        }
        View::Done { .. } => {}
    }
    false
}

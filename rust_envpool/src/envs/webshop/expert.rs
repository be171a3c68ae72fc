//! A scripted good policy (for tests and warm-up): search with the instruction, open the goal's
//! product when it is listed (paging through the 50 hits), choose the goal's options, buy. When
//! the instruction's results do not hold the product it searches again with the product's title;
//! when those do not either, it buys the best-ranked product.
//! The next action is a function of the env's state only.

use super::catalog::GoalOptions;
use super::pages::View;
use super::pytext::py_lower;
use super::WebShopEnv;

/// Results pages to look through per query.
const MAX_PAGES: i64 = 5;

impl WebShopEnv {
    /// The queries the expert tries, in order.
    fn expert_queries(&self) -> [String; 2] {
        let g = self.goal();
        [py_lower(&g.instruction_text), py_lower(&g.name)]
    }

    /// The expert's next action, or None once the episode is over (done page).
    pub fn expert_action(&self) -> Option<String> {
        let goal = self.goal();
        let target = py_lower(&goal.asin);
        let has = |c: &str| self.clickables.iter().any(|(k, _)| k == c);
        let queries = self.expert_queries();
        let current_query = self.keywords.as_ref().map(|k| k.join(" "));
        match &self.view {
            View::Search => Some(format!("search[{}]", queries[0])),
            View::Results { page, products, .. } => {
                if has(&target) {
                    return Some(format!("click[{target}]"));
                }
                if !products.is_empty() && *page < MAX_PAGES && has("next >") {
                    return Some("click[next >]".into());
                }
                if current_query.as_deref() == Some(queries[0].as_str()) {
                    return Some(format!("search[{}]", queries[1]));
                }
                // nothing left to try: the best-ranked product of the first page
                products
                    .first()
                    .map(|&i| format!("click[{}]", py_lower(self.shop.catalog.product(i).asin())))
            }
            View::Item { .. } => {
                let wanted: Vec<&str> = match &goal.goal_options {
                    GoalOptions::Dict(d) => d.iter().map(|(_, v)| v.as_str()).collect(),
                    GoalOptions::List(l) => l.iter().map(String::as_str).collect(),
                };
                for v in wanted {
                    let chosen = self.options.iter().any(|(_, c)| c == v);
                    if !chosen && has(v) && v != "buy now" {
                        return Some(format!("click[{v}]"));
                    }
                }
                Some("click[buy now]".into())
            }
            View::Sub { .. } => Some("click[< prev]".into()),
            View::Done { .. } => None,
        }
    }
}

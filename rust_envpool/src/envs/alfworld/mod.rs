//! Native ALFWorld engine: plays a TextWorld PDDL game (`game.tw-pddl`) exactly as alfworld 0.4.2 /
//! TextWorld 1.7.0 do (`textworld.envs.pddl.PddlEnv` + `AlfredDemangler(shuffle=False)` +
//! `AlfredInfos`, a 50-step `Limit`, and the batch env's "a finished game keeps returning its last
//! state"): same observations, same sorted admissible commands, same score / done / won.
//!
//! Two code paths play the same game: [`AlfworldEnv::new`] (fast: quantified variables and action
//! parameters drawn from the facts that constrain them, command texts of fact-independent
//! templates cached per game, the reset state computed once) and [`AlfworldEnv::new_reference`]
//! (plain: every parameter tried over its type, every text derived afresh). The
//! `tests/alfworld_games.rs` differential test plays every shared game through both.
//!
//! Everything comes from the game file: the PDDL domain and problem are interpreted (typed
//! grounding of actions, `and`/`or`/`not`/`exists`/`=` preconditions, conditional effects, the
//! existential goal) and the text comes from the file's grammar (templates, feedback rules and the
//! context-sensitive text grammar with its fact queries).

pub mod expert;
pub mod grammar;
pub mod pddl;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use crate::envs::{EnvStep, TextEnv};
use grammar::{CondExpr, Expr, GrammarDoc, Query, Sym};
use pddl::{Interner, RawFormula};

/// Error loading a game; the message names the source and the key.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{source_name}: {message}")]
    Io {
        source_name: String,
        message: String,
        #[source]
        err: std::io::Error,
    },
    #[error("{source_name}: key `{key}`: {message}")]
    Key {
        source_name: String,
        key: String,
        message: String,
    },
    #[error("{source_name}: {message}")]
    Format { source_name: String, message: String },
}

impl LoadError {
    /// True when the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, LoadError::Io { err, .. } if err.kind() == std::io::ErrorKind::NotFound)
    }
}

/// A term of a compiled formula.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Term {
    Var(usize),
    Obj(u32),
    /// A constant the problem does not declare: atoms using it are false.
    Missing,
}

/// A compiled formula (variables resolved to slots).
#[derive(Clone, Debug)]
enum Formula {
    True,
    And(Vec<Formula>),
    Or(Vec<Formula>),
    Not(Box<Formula>),
    Atom(u32, Vec<Term>),
    Eq(Term, Term),
    /// Quantified variables, the body's conjuncts, for each conjunct the index of the last
    /// quantified variable it needs (checked as soon as that variable is bound), and for each
    /// variable the positive atoms among those conjuncts that mention it (their facts enumerate
    /// the variable's candidates on the fast path).
    Exists(Vec<(usize, Option<u32>)>, Vec<Formula>, Vec<usize>, Vec<Vec<usize>>),
    Forall(Vec<(usize, Option<u32>)>, Box<Formula>),
}

fn slots_in(f: &Formula, out: &mut Vec<usize>) {
    let term = |t: &Term, out: &mut Vec<usize>| {
        if let Term::Var(i) = t {
            out.push(*i)
        }
    };
    match f {
        Formula::True => {}
        Formula::And(v) | Formula::Or(v) => v.iter().for_each(|x| slots_in(x, out)),
        Formula::Not(x) => slots_in(x, out),
        Formula::Atom(_, a) => a.iter().for_each(|t| term(t, out)),
        Formula::Eq(a, b) => {
            term(a, out);
            term(b, out)
        }
        Formula::Exists(_, c, _, _) => c.iter().for_each(|x| slots_in(x, out)),
        Formula::Forall(_, b) => slots_in(b, out),
    }
}

#[derive(Clone, Debug)]
struct Effect {
    forall: Vec<(usize, Option<u32>)>,
    condition: Option<Formula>,
    positive: bool,
    pred: u32,
    args: Vec<Term>,
}

#[derive(Clone, Debug)]
struct Action {
    name: String,
    /// (name without `?`, type name, type id)
    params: Vec<(String, String, Option<u32>)>,
    slots: usize,
    /// Top-level literals with the last parameter they need: (max slot, positive?, formula).
    literals: Vec<(usize, Formula)>,
    /// Per literal, the parameters it mentions (bit k: parameter k).
    literal_masks: Vec<u64>,
    /// The rest of the top-level conjunction (evaluated once all parameters are bound).
    rest: Vec<Formula>,
    /// Per parameter: a positive literal (index into `literals`) whose facts enumerate the
    /// parameter's candidates once the earlier parameters are bound.
    generators: Vec<Option<usize>>,
    /// Positive top-level precondition atoms (for the no-op pruning of the PDDL translator).
    pre_atoms: Vec<(u32, Vec<Term>)>,
    effects: Vec<Effect>,
    template: Vec<Sym>,
    feedback: Vec<Sym>,
}

/// Facts: per predicate id, the sorted argument tuples.
type Facts = Vec<BTreeSet<Vec<u32>>>;

/// Placeholder bindings of a query: (name, type, object).
type Binding = Vec<(String, String, u32)>;

/// A parsed game, immutable and cheap to share (`Arc<GameSpec>`).
#[derive(Debug)]
pub struct GameSpec {
    source: String,
    /// Object ids (lowercased), sorted; an object's index is its rank.
    objects: Vec<String>,
    obj_type: Vec<u32>,
    /// Demangled display names.
    names: Vec<String>,
    types: Interner,
    type_parent: Vec<Option<u32>>,
    /// Objects of each type (subtypes included; `object` is the root of every type).
    objs_of_type: Vec<Vec<u32>>,
    preds: Interner,
    /// pred id -> id of its `not_` twin, and back.
    neg_of: Vec<u32>,
    actions: Vec<Action>,
    goal: Formula,
    goal_slots: usize,
    goal_raw: RawFormula,
    init: Facts,
    rules: HashMap<String, Vec<grammar::Production>>,
    task: String,
    task_type: String,
    walkthrough: Vec<String>,
    /// The agent object (first object of type `agent`).
    agent: Option<u32>,
    /// Per action: its command text depends on the parameters only (the template queries no
    /// predicate an action changes), so it is cached in `command_cache`.
    static_template: Vec<bool>,
    command_cache: std::sync::RwLock<CommandCache>,
    /// The state after reset, computed once (fast path).
    initial: std::sync::OnceLock<Initial>,
}

/// What every reset starts from: applicable actions, their commands, the admissible list, the
/// intro text.
#[derive(Debug)]
struct Initial {
    valid: Vec<(usize, Vec<u32>)>,
    commands: Vec<Arc<str>>,
    admissible: Vec<String>,
    intro: String,
}

/// Most parameters of an action whose command text is cached.
const CACHE_ARGS: usize = 6;

/// An action and its arguments padded with `u32::MAX`.
type CommandKey = (u32, [u32; CACHE_ARGS]);

/// Command key -> command text.
type CommandCache = ahash::AHashMap<CommandKey, Arc<str>>;

/// Most command texts an env keeps copies of (far more than one game's commands).
const ENV_TEXTS: usize = 1 << 12;

/// The six ALFWorld task types.
pub const TASK_TYPES: [&str; 6] = [
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
];

struct Compiler<'a> {
    objects: &'a HashMap<String, u32>,
    types: &'a Interner,
    preds: &'a mut Interner,
    scope: Vec<String>,
    slots: usize,
}

impl Compiler<'_> {
    fn term(&self, s: &str) -> Term {
        if s.starts_with('?') {
            match self.scope.iter().rposition(|v| v == s) {
                Some(i) => Term::Var(i),
                None => Term::Missing,
            }
        } else {
            self.objects.get(s).map(|&o| Term::Obj(o)).unwrap_or(Term::Missing)
        }
    }
    fn bind(&mut self, vars: &[(String, String)]) -> Vec<(usize, Option<u32>)> {
        let mut out = Vec::new();
        for (v, t) in vars {
            self.scope.push(v.clone());
            let slot = self.scope.len() - 1;
            self.slots = self.slots.max(self.scope.len());
            out.push((slot, self.types.get(t)));
        }
        out
    }
    fn formula(&mut self, f: &RawFormula) -> Formula {
        match f {
            RawFormula::True => Formula::True,
            RawFormula::And(v) => Formula::And(v.iter().map(|x| self.formula(x)).collect()),
            RawFormula::Or(v) => Formula::Or(v.iter().map(|x| self.formula(x)).collect()),
            RawFormula::Not(x) => Formula::Not(Box::new(self.formula(x))),
            RawFormula::Imply(a, b) => Formula::Or(vec![Formula::Not(Box::new(self.formula(a))), self.formula(b)]),
            RawFormula::Atom(p, args) => {
                let terms: Vec<Term> = args.iter().map(|a| self.term(a)).collect();
                if p == "=" && terms.len() == 2 {
                    Formula::Eq(terms[0], terms[1])
                } else {
                    let id = self.preds.intern(p);
                    self.preds.intern(&format!("not_{p}"));
                    Formula::Atom(id, terms)
                }
            }
            RawFormula::Exists(vars, body) | RawFormula::Forall(vars, body) => {
                let n = self.scope.len();
                let b = self.bind(vars);
                let inner = self.formula(body);
                self.scope.truncate(n);
                if matches!(f, RawFormula::Exists(..)) {
                    let conj = match inner {
                        Formula::And(v) => v,
                        other => vec![other],
                    };
                    let stages: Vec<usize> = conj
                        .iter()
                        .map(|c| {
                            let mut used = Vec::new();
                            slots_in(c, &mut used);
                            b.iter().rposition(|(slot, _)| used.contains(slot)).unwrap_or(0)
                        })
                        .collect();
                    let gens = b
                        .iter()
                        .enumerate()
                        .map(|(i, (slot, _))| {
                            (0..conj.len())
                                .filter(|&c| {
                                    stages[c] == i
                                        && matches!(&conj[c], Formula::Atom(_, args)
                                            if args.contains(&Term::Var(*slot)) && !args.contains(&Term::Missing))
                                })
                                .collect()
                        })
                        .collect();
                    Formula::Exists(b, conj, stages, gens)
                } else {
                    Formula::Forall(b, Box::new(inner))
                }
            }
        }
    }
}

fn max_slot(f: &Formula) -> Option<usize> {
    match f {
        Formula::Atom(_, a) => a
            .iter()
            .filter_map(|t| if let Term::Var(i) = t { Some(*i) } else { None })
            .max(),
        Formula::Eq(a, b) => [a, b]
            .iter()
            .filter_map(|t| if let Term::Var(i) = t { Some(*i) } else { None })
            .max(),
        Formula::Not(x) => max_slot(x),
        _ => None,
    }
}

/// Alfred's demangler: `Cabinet_bar__plus_01...` -> `cabinet N`, numbered per prefix in sorted-id
/// order with the first id getting the highest number; ids without `_bar_` keep their text.
fn demangle(ids: &[String]) -> Result<Vec<String>, String> {
    let mut sorted: Vec<&String> = ids.iter().collect();
    sorted.sort();
    let mut count: HashMap<String, usize> = HashMap::new();
    for id in &sorted {
        if let Some((name, _)) = id.split_once("_bar_") {
            let mut name = name.to_string();
            if id.contains("basin") {
                name.push_str("basin");
            }
            *count.entry(name).or_default() += 1;
        }
    }
    let mut next: HashMap<String, usize> = count.clone();
    let mut out: HashMap<&str, String> = HashMap::new();
    for id in &sorted {
        let text = id
            .replace("_bar_", "|")
            .replace("_minus_", "-")
            .replace("_plus_", "+")
            .replace("_dot_", ".")
            .replace("_comma_", ",");
        let name = match text.split_once('|') {
            None => format!("{text} "),
            Some((name, _)) => {
                let mut name = name.to_string();
                if id.contains("basin") {
                    name.push_str("basin");
                }
                let n = next
                    .get_mut(&name)
                    .ok_or_else(|| format!("cannot number object `{id}`"))?;
                let num = *n;
                *n -= 1;
                if num > 0 {
                    format!("{name} {num}")
                } else {
                    format!("{name} ")
                }
            }
        };
        out.insert(id.as_str(), name);
    }
    Ok(ids.iter().map(|i| out.remove(i.as_str()).unwrap_or_default()).collect())
}

impl GameSpec {
    /// Reads a `game.tw-pddl` file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<GameSpec, LoadError> {
        let path = path.as_ref();
        let source = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|err| LoadError::Io {
            source_name: source.clone(),
            message: format!("cannot read the game file: {err}"),
            err,
        })?;
        let text = String::from_utf8(bytes).map_err(|_| LoadError::Format {
            source_name: source.clone(),
            message: "not UTF-8 text".into(),
        })?;
        let mut spec = Self::from_json_str(&text, &source)?;
        if spec.task_type == "unknown" {
            // Fall back on the ALFWorld folder name `<task_type>-<obj>-<mrecep>-<recep>-<scene>`.
            if let Some(tt) = path
                .ancestors()
                .filter_map(|p| p.file_name()?.to_str())
                .find_map(|n| TASK_TYPES.iter().find(|t| n.starts_with(&format!("{t}-"))))
            {
                spec.task_type = tt.to_string();
            }
        }
        Ok(spec)
    }

    /// Parses the JSON text of a game; `source` names it in errors.
    pub fn from_json_str(text: &str, source: &str) -> Result<GameSpec, LoadError> {
        let fmt = |m: String| LoadError::Format {
            source_name: source.to_string(),
            message: m,
        };
        let keyerr = |k: &str, m: String| LoadError::Key {
            source_name: source.to_string(),
            key: k.into(),
            message: m,
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| fmt(format!("not valid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| fmt("the game is not a JSON object".into()))?;
        let get = |k: &str| -> Result<&str, LoadError> {
            obj.get(k)
                .ok_or_else(|| keyerr(k, "missing".into()))?
                .as_str()
                .ok_or_else(|| keyerr(k, "expected a string".into()))
        };
        let domain_text = get("pddl_domain")?;
        let problem_text = get("pddl_problem")?;
        let grammar_text = get("grammar")?;
        let walkthrough = match obj.get("walkthrough") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect(),
            Some(_) => return Err(keyerr("walkthrough", "expected a list of strings".into())),
        };
        let domain = pddl::parse_domain(domain_text).map_err(|m| keyerr("pddl_domain", m))?;
        let problem = pddl::parse_problem(problem_text).map_err(|m| keyerr("pddl_problem", m))?;
        let doc: GrammarDoc = grammar::parse_document(grammar_text).map_err(|m| keyerr("grammar", m))?;
        let goal_raw = problem
            .goal
            .clone()
            .ok_or_else(|| keyerr("pddl_problem", "no :goal".into()))?;

        // Types: `object` is the root (as in Fast Downward).
        let mut types = Interner::default();
        types.intern("object");
        let mut parent_names: Vec<(String, String)> = Vec::new();
        for (t, p) in &domain.types {
            types.intern(t);
            types.intern(p);
            if t != "object" {
                parent_names.push((t.clone(), p.clone()));
            }
        }
        let mut objs: Vec<(String, String)> = domain.constants.clone();
        objs.extend(problem.objects.iter().cloned());
        for (_, t) in &objs {
            types.intern(t);
        }
        let mut type_parent: Vec<Option<u32>> = vec![None; types.names.len()];
        for (i, name) in types.names.iter().enumerate() {
            if name != "object" {
                type_parent[i] = Some(0);
            }
        }
        for (t, p) in &parent_names {
            type_parent[types.get(t).unwrap() as usize] = types.get(p);
        }
        // Objects, sorted by id; the first declaration of an id wins.
        let mut decl: HashMap<String, String> = HashMap::new();
        for (o, t) in &objs {
            decl.entry(o.clone()).or_insert_with(|| t.clone());
        }
        let mut objects: Vec<String> = decl.keys().cloned().collect();
        objects.sort();
        let obj_index: HashMap<String, u32> = objects.iter().enumerate().map(|(i, o)| (o.clone(), i as u32)).collect();
        let obj_type: Vec<u32> = objects.iter().map(|o| types.get(&decl[o]).unwrap()).collect();
        let is_sub = |mut t: u32, of: u32| -> bool {
            for _ in 0..64 {
                if t == of {
                    return true;
                }
                match type_parent[t as usize] {
                    Some(p) => t = p,
                    None => return false,
                }
            }
            false
        };
        let objs_of_type: Vec<Vec<u32>> = (0..types.names.len() as u32)
            .map(|t| {
                (0..objects.len() as u32)
                    .filter(|&o| is_sub(obj_type[o as usize], t))
                    .collect()
            })
            .collect();

        let mut preds = Interner::default();
        // Init facts.
        let mut init_list: Vec<(u32, Vec<u32>)> = Vec::new();
        for (p, args) in &problem.init {
            let mut ids = Vec::new();
            for a in args {
                ids.push(*obj_index.get(a).ok_or_else(|| {
                    keyerr(
                        "pddl_problem",
                        format!(":init fact `{p}` uses the undeclared object `{a}`"),
                    )
                })?);
            }
            let pid = preds.intern(p);
            preds.intern(&format!("not_{p}"));
            init_list.push((pid, ids));
        }
        // Actions (only those the grammar describes are playable, as in the reference).
        let mut actions = Vec::new();
        for a in &domain.actions {
            let Some(text) = doc.actions.get(&a.name) else { continue };
            let mut c = Compiler {
                objects: &obj_index,
                types: &types,
                preds: &mut preds,
                scope: Vec::new(),
                slots: 0,
            };
            let params: Vec<(String, String, Option<u32>)> = a
                .params
                .iter()
                .map(|(n, t)| (n.trim_start_matches('?').to_string(), t.clone(), types.get(t)))
                .collect();
            c.bind(&a.params);
            let pre = c.formula(&a.precondition);
            let conj = match pre {
                Formula::And(v) => v,
                Formula::True => vec![],
                other => vec![other],
            };
            let mut literals = Vec::new();
            let mut rest = Vec::new();
            let mut pre_atoms = Vec::new();
            for f in conj {
                if let Formula::Atom(p, args) = &f {
                    pre_atoms.push((*p, args.clone()));
                }
                match (&f, max_slot(&f)) {
                    (Formula::Atom(..) | Formula::Eq(..), Some(m)) => literals.push((m, f)),
                    (Formula::Not(inner), Some(m)) if matches!(**inner, Formula::Atom(..) | Formula::Eq(..)) => {
                        literals.push((m, f))
                    }
                    _ => rest.push(f),
                }
            }
            let mut effects = Vec::new();
            for e in &a.effects {
                let n = c.scope.len();
                let forall = c.bind(&e.forall);
                let condition = e.condition.as_ref().map(|f| c.formula(f));
                let pred = c.preds.intern(&e.pred);
                c.preds.intern(&format!("not_{}", e.pred));
                let args = e.args.iter().map(|x| c.term(x)).collect();
                c.scope.truncate(n);
                effects.push(Effect {
                    forall,
                    condition,
                    positive: e.positive,
                    pred,
                    args,
                });
            }
            let slots = c.slots.max(params.len());
            let generators = (0..params.len())
                .map(|k| {
                    literals.iter().position(|(m, f)| {
                        *m == k && matches!(f, Formula::Atom(_, args) if args.contains(&Term::Var(k)) && !args.contains(&Term::Missing))
                    })
                })
                .collect();
            let literal_masks = literals
                .iter()
                .map(|(_, f)| {
                    let mut used = Vec::new();
                    slots_in(f, &mut used);
                    used.iter().filter(|&&j| j < 64).fold(0u64, |m, &j| m | (1u64 << j))
                })
                .collect();
            actions.push(Action {
                generators,
                literal_masks,
                name: a.name.clone(),
                params,
                slots,
                literals,
                rest,
                pre_atoms,
                effects,
                template: text.template.clone(),
                feedback: text.feedback.clone(),
            });
        }
        let mut c = Compiler {
            objects: &obj_index,
            types: &types,
            preds: &mut preds,
            scope: Vec::new(),
            slots: 0,
        };
        let goal = c.formula(&goal_raw);
        let goal_slots = c.slots;
        // Intern the not_ twins of every predicate the grammar queries.
        for prods in doc.rules.values() {
            for p in prods {
                if let Some(q) = &p.condition {
                    for qp in &q.preds {
                        preds.intern(&qp.name);
                    }
                }
            }
        }
        let n = preds.names.len();
        for i in 0..n {
            let name = preds.names[i].clone();
            match name.strip_prefix("not_") {
                Some(base) => {
                    preds.intern(base);
                }
                None => {
                    preds.intern(&format!("not_{name}"));
                }
            }
        }
        let neg_of: Vec<u32> = preds
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let twin = match n.strip_prefix("not_") {
                    Some(base) => preds.get(base),
                    None => preds.get(&format!("not_{n}")),
                };
                twin.unwrap_or(i as u32)
            })
            .collect();
        let mut init: Facts = vec![BTreeSet::new(); preds.names.len()];
        for (p, args) in init_list {
            init[p as usize].insert(args);
        }
        // Display names: only entities that appear in a fact get numbered (as in the reference).
        let mut in_facts: BTreeSet<u32> = BTreeSet::new();
        for set in &init {
            for args in set {
                in_facts.extend(args.iter().copied());
            }
        }
        let ent_ids: Vec<String> = in_facts.iter().map(|&o| objects[o as usize].clone()).collect();
        let ent_names = demangle(&ent_ids).map_err(|m| keyerr("pddl_problem", m))?;
        let mut names: Vec<String> = objects.clone();
        for (o, n) in in_facts.iter().zip(ent_names) {
            names[*o as usize] = n;
        }
        let agent = types
            .get("agent")
            .and_then(|t| objs_of_type[t as usize].first().copied());

        let mut spec = GameSpec {
            source: source.to_string(),
            objects,
            obj_type,
            names,
            types,
            type_parent,
            objs_of_type,
            preds,
            neg_of,
            actions,
            goal,
            goal_slots,
            goal_raw,
            init,
            rules: doc.rules,
            task: String::new(),
            task_type: String::new(),
            walkthrough,
            agent,
            static_template: Vec::new(),
            command_cache: Default::default(),
            initial: Default::default(),
        };
        spec.static_template = spec.actions.iter().map(|a| spec.syms_static(&a.template, 0)).collect();
        if !spec.rules.contains_key("intro") {
            return Err(keyerr("grammar", "no `intro` rule".into()));
        }
        // Task text: the `task` rule without its "Your task is to: " lead.
        if spec.rules.contains_key("task") {
            let t = spec
                .derive(&[Sym::Nonterminal("task".into())], &Ctx::default(), &spec.init)
                .map_err(|m| keyerr("grammar", m))?;
            spec.task = t.strip_prefix("Your task is to: ").unwrap_or(&t).to_string();
        }
        spec.task_type = expert::task_type_of(&spec).to_string();
        Ok(spec)
    }

    /// Predicates some action effect changes (and their `not_` twins).
    fn changed_preds(&self) -> BTreeSet<u32> {
        let mut out = BTreeSet::new();
        for a in &self.actions {
            for e in &a.effects {
                out.insert(e.pred);
                out.insert(self.neg_of[e.pred as usize]);
            }
        }
        out
    }

    /// True when deriving `syms` reads no fact an action can change (so the text is a function
    /// of the bound variables alone).
    fn syms_static(&self, syms: &[Sym], depth: usize) -> bool {
        if depth > 16 {
            return false;
        }
        let changed = self.changed_preds();
        let query_static = |q: &Option<Query>| {
            q.as_ref().is_none_or(|q| {
                q.preds
                    .iter()
                    .all(|qp| self.pred(&qp.name).is_none_or(|p| !changed.contains(&p)))
            })
        };
        let rule_static = |name: &str| {
            self.rules.get(name).is_some_and(|prods| {
                prods
                    .iter()
                    .all(|p| query_static(&p.condition) && self.syms_static(&p.rhs, depth + 1))
            })
        };
        let expr_static = |e: &CondExpr| match e {
            CondExpr::Nonterminal(n) => rule_static(n),
            CondExpr::Eval(_) => true,
        };
        syms.iter().all(|s| match s {
            Sym::Terminal(_) => true,
            Sym::Nonterminal(n) => rule_static(n),
            Sym::Cond { expr, given } => query_static(given) && expr_static(expr),
            Sym::List { expr, given } => {
                query_static(given)
                    && expr_static(expr)
                    && ["list_empty", "list_separator", "list_last_separator"]
                        .iter()
                        .all(|r| rule_static(r))
            }
        })
    }

    /// The cache key of a grounded action whose command text depends on its arguments only.
    fn command_key(&self, ai: usize, args: &[u32]) -> Option<CommandKey> {
        if !self.static_template[ai] || args.len() > CACHE_ARGS {
            return None;
        }
        let mut key = (ai as u32, [u32::MAX; CACHE_ARGS]);
        key.1[..args.len()].copy_from_slice(args);
        Some(key)
    }

    /// The command text of a grounded action in state `facts` (cached when the template is
    /// static; [`Self::command_text_plain`] is the plain path).
    fn command_text(&self, ai: usize, args: &[u32], facts: &Facts) -> Arc<str> {
        let Some(key) = self.command_key(ai, args) else {
            return self.command_text_plain(ai, args, facts).into();
        };
        if let Some(t) = self.command_cache.read().ok().and_then(|m| m.get(&key).cloned()) {
            return t;
        }
        let t: Arc<str> = self.command_text_plain(ai, args, facts).into();
        if let Ok(mut m) = self.command_cache.write() {
            if m.len() < 1 << 16 {
                m.insert(key, t.clone());
            }
        }
        t
    }

    fn command_text_plain(&self, ai: usize, args: &[u32], facts: &Facts) -> String {
        let ctx = self.action_ctx(ai, args);
        self.derive(&self.actions[ai].template, &ctx, facts)
            .unwrap_or_else(|e| format!("<{e}>"))
    }

    /// Where the game came from (file path or the label given to `from_json_str`).
    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn task(&self) -> &str {
        &self.task
    }
    pub fn task_type(&self) -> &str {
        &self.task_type
    }
    /// The walkthrough stored in the game file (may be empty).
    pub fn walkthrough(&self) -> &[String] {
        &self.walkthrough
    }

    fn type_id(&self, name: &str) -> Option<u32> {
        self.types.get(name)
    }
    fn is_subtype(&self, mut t: u32, of: u32) -> bool {
        for _ in 0..64 {
            if t == of {
                return true;
            }
            match self.type_parent[t as usize] {
                Some(p) => t = p,
                None => return false,
            }
        }
        false
    }
    fn objs(&self, t: Option<u32>) -> &[u32] {
        match t {
            Some(t) => &self.objs_of_type[t as usize],
            None => &[],
        }
    }
    fn pred(&self, name: &str) -> Option<u32> {
        self.preds.get(name)
    }

    // ------------------------------------------------------------ formulas

    fn term(t: Term, env: &[u32]) -> Option<u32> {
        match t {
            Term::Obj(o) => Some(o),
            Term::Var(i) => env.get(i).copied().filter(|&v| v != u32::MAX),
            Term::Missing => None,
        }
    }

    /// Truth of a formula (fast path: quantified variables drawn from the facts of an atom that
    /// mentions them).
    fn holds(&self, f: &Formula, env: &mut Vec<u32>, facts: &Facts) -> bool {
        self.holds_g::<true>(f, env, facts)
    }

    /// Plain path of [`Self::holds`]: quantified variables range over every object of their type.
    fn holds_plain(&self, f: &Formula, env: &mut Vec<u32>, facts: &Facts) -> bool {
        self.holds_g::<false>(f, env, facts)
    }

    fn holds_g<const FAST: bool>(&self, f: &Formula, env: &mut Vec<u32>, facts: &Facts) -> bool {
        match f {
            Formula::True => true,
            Formula::And(v) => v.iter().all(|x| self.holds_g::<FAST>(x, env, facts)),
            Formula::Or(v) => v.iter().any(|x| self.holds_g::<FAST>(x, env, facts)),
            Formula::Not(x) => !self.holds_g::<FAST>(x, env, facts),
            Formula::Atom(p, args) => {
                let mut buf = [0u32; 8];
                if args.len() > buf.len() {
                    let t: Option<Vec<u32>> = args.iter().map(|a| Self::term(*a, env)).collect();
                    return t.is_some_and(|t| facts[*p as usize].contains(&t));
                }
                for (k, a) in args.iter().enumerate() {
                    match Self::term(*a, env) {
                        Some(o) => buf[k] = o,
                        None => return false,
                    }
                }
                facts[*p as usize].contains(&buf[..args.len()])
            }
            Formula::Eq(a, b) => match (Self::term(*a, env), Self::term(*b, env)) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            },
            Formula::Exists(vars, conj, stages, gens) => {
                if vars.is_empty() {
                    return conj.iter().all(|c| self.holds_g::<FAST>(c, env, facts));
                }
                if FAST {
                    self.exists_fast(vars, conj, stages, gens, 0, env, facts)
                } else {
                    self.exists(vars, conj, stages, 0, env, facts)
                }
            }
            Formula::Forall(vars, body) => self.quant::<FAST>(vars, 0, body, env, facts, false),
        }
    }

    /// Tuples of `facts[p]` that may match `args` when `args[0]` is bound: a prefix range of the
    /// sorted set; else the whole set.
    fn candidate_tuples<'f>(
        facts: &'f Facts,
        p: u32,
        args: &[Term],
        env: &[u32],
        free: usize,
    ) -> std::collections::btree_set::Range<'f, Vec<u32>> {
        let set = &facts[p as usize];
        let first = match args.first() {
            Some(Term::Var(s)) if *s == free => None,
            Some(t) => Self::term(*t, env),
            None => None,
        };
        match first.and_then(|v| Some((v, v.checked_add(1)?))) {
            Some((v, next)) => set.range::<[u32], _>((
                std::ops::Bound::Included(&[v][..]),
                std::ops::Bound::Excluded(&[next][..]),
            )),
            None => set.range::<[u32], _>(..),
        }
    }

    /// The value `tuple` gives variable `free` when it matches `args` under `env`.
    fn match_free(args: &[Term], tuple: &[u32], env: &[u32], free: usize) -> Option<u32> {
        if tuple.len() != args.len() {
            return None;
        }
        let mut val = None;
        for (term, &o) in args.iter().zip(tuple) {
            match term {
                Term::Var(i) if *i == free => {
                    if val.is_some_and(|v| v != o) {
                        return None;
                    }
                    val = Some(o);
                }
                other => {
                    if Self::term(*other, env) != Some(o) {
                        return None;
                    }
                }
            }
        }
        val
    }

    /// [`Self::exists`] drawing each variable's candidates from the facts of a positive atom of
    /// its stage (the one with a bound first argument, else the smallest fact set) when there is
    /// one: the same truth value, since that atom must hold for any witness.
    #[allow(clippy::too_many_arguments)]
    fn exists_fast(
        &self,
        vars: &[(usize, Option<u32>)],
        conj: &[Formula],
        stages: &[usize],
        gens: &[Vec<usize>],
        i: usize,
        env: &mut Vec<u32>,
        facts: &Facts,
    ) -> bool {
        if i == vars.len() {
            return true;
        }
        let (slot, t) = vars[i];
        if env.len() <= slot {
            env.resize(slot + 1, u32::MAX);
        }
        let Some(t) = t else { return false };
        let saved = env[slot];
        let mut best: Option<(usize, u32, &[Term])> = None;
        for &ci in &gens[i] {
            let Formula::Atom(p, args) = &conj[ci] else { continue };
            let prefixed = match args.first() {
                Some(Term::Var(s)) if *s == slot => false,
                Some(a) => Self::term(*a, env).is_some(),
                None => false,
            };
            let cost = if prefixed { 0 } else { 1 + facts[*p as usize].len() };
            if best.is_none_or(|(c, _, _)| cost < c) {
                best = Some((cost, *p, args));
            }
        }
        let mut found = false;
        let try_one = |o: u32, env: &mut Vec<u32>| -> bool {
            env[slot] = o;
            conj.iter()
                .zip(stages)
                .filter(|(_, s)| **s == i)
                .all(|(c, _)| self.holds_g::<true>(c, env, facts))
                && self.exists_fast(vars, conj, stages, gens, i + 1, env, facts)
        };
        match best {
            Some((_, p, args)) => {
                for tuple in Self::candidate_tuples(facts, p, args, env, slot) {
                    let Some(o) = Self::match_free(args, tuple, env, slot) else {
                        continue;
                    };
                    if self.is_subtype(self.obj_type[o as usize], t) && try_one(o, env) {
                        found = true;
                        break;
                    }
                }
            }
            None => {
                for &o in self.objs(Some(t)) {
                    if try_one(o, env) {
                        found = true;
                        break;
                    }
                }
            }
        }
        env[slot] = saved;
        found
    }

    /// Binds the quantified variables one by one, checking each conjunct as soon as its variables
    /// are bound (`exists_reference` is the plain version).
    fn exists(
        &self,
        vars: &[(usize, Option<u32>)],
        conj: &[Formula],
        stages: &[usize],
        i: usize,
        env: &mut Vec<u32>,
        facts: &Facts,
    ) -> bool {
        if i == vars.len() {
            return true;
        }
        let (slot, t) = vars[i];
        if env.len() <= slot {
            env.resize(slot + 1, u32::MAX);
        }
        let saved = env[slot];
        let mut found = false;
        for &o in self.objs(t) {
            env[slot] = o;
            if conj
                .iter()
                .zip(stages)
                .filter(|(_, s)| **s == i)
                .all(|(c, _)| self.holds_plain(c, env, facts))
                && self.exists(vars, conj, stages, i + 1, env, facts)
            {
                found = true;
                break;
            }
        }
        env[slot] = saved;
        found
    }

    /// Plain reference for [`Self::holds`]: quantifiers try every assignment before looking at
    /// the body.
    #[cfg(test)]
    fn holds_reference(&self, f: &Formula, env: &mut Vec<u32>, facts: &Facts) -> bool {
        match f {
            Formula::And(v) => v.iter().all(|x| self.holds_reference(x, env, facts)),
            Formula::Or(v) => v.iter().any(|x| self.holds_reference(x, env, facts)),
            Formula::Not(x) => !self.holds_reference(x, env, facts),
            Formula::Exists(vars, conj, _, _) => {
                let mut all = vec![vec![]];
                for (_, t) in vars {
                    all = all
                        .into_iter()
                        .flat_map(|p: Vec<u32>| self.objs(*t).iter().map(move |&o| [p.clone(), vec![o]].concat()))
                        .collect();
                }
                let saved = env.clone();
                let r = all.iter().any(|assign| {
                    for ((slot, _), o) in vars.iter().zip(assign) {
                        if env.len() <= *slot {
                            env.resize(slot + 1, u32::MAX);
                        }
                        env[*slot] = *o;
                    }
                    conj.iter().all(|c| self.holds_reference(c, env, facts))
                });
                *env = saved;
                r
            }
            other => self.holds_plain(other, env, facts),
        }
    }

    /// Plain reference for [`Self::applicable`]: every parameter tuple, whole precondition.
    #[cfg(test)]
    fn applicable_reference(&self, facts: &Facts) -> Vec<(usize, Vec<u32>)> {
        let mut out = Vec::new();
        for (ai, a) in self.actions.iter().enumerate() {
            let mut tuples = vec![vec![]];
            for (_, _, t) in &a.params {
                tuples = tuples
                    .into_iter()
                    .flat_map(|p: Vec<u32>| self.objs(*t).iter().map(move |&o| [p.clone(), vec![o]].concat()))
                    .collect();
            }
            for tup in tuples {
                let mut env = vec![u32::MAX; a.slots.max(1)];
                env[..tup.len()].copy_from_slice(&tup);
                let ok = a.literals.iter().all(|(_, f)| self.holds_reference(f, &mut env, facts))
                    && a.rest.iter().all(|f| self.holds_reference(f, &mut env, facts))
                    && !self.is_noop(a, &env);
                if ok {
                    out.push((ai, tup));
                }
            }
        }
        out
    }

    fn quant<const FAST: bool>(
        &self,
        vars: &[(usize, Option<u32>)],
        i: usize,
        body: &Formula,
        env: &mut Vec<u32>,
        facts: &Facts,
        exists: bool,
    ) -> bool {
        if i == vars.len() {
            return self.holds_g::<FAST>(body, env, facts);
        }
        let (slot, t) = vars[i];
        if env.len() <= slot {
            env.resize(slot + 1, u32::MAX);
        }
        let saved = env[slot];
        let mut result = !exists;
        for &o in self.objs(t) {
            env[slot] = o;
            let r = self.quant::<FAST>(vars, i + 1, body, env, facts, exists);
            if r == exists {
                result = exists;
                break;
            }
        }
        env[slot] = saved;
        result
    }

    /// Every applicable grounded action, in domain order then parameter order.
    fn applicable(&self, facts: &Facts) -> Vec<(usize, Vec<u32>)> {
        self.applicable_g::<true>(facts)
    }

    /// Plain path of [`Self::applicable`] (whole fact sets scanned, plain quantifiers).
    fn applicable_plain(&self, facts: &Facts) -> Vec<(usize, Vec<u32>)> {
        self.applicable_g::<false>(facts)
    }

    fn applicable_g<const FAST: bool>(&self, facts: &Facts) -> Vec<(usize, Vec<u32>)> {
        let mut out = Vec::new();
        let mut tuples = Vec::new();
        for (ai, a) in self.actions.iter().enumerate() {
            let mut env = vec![u32::MAX; a.slots.max(1)];
            if !FAST || a.params.len() > 64 {
                self.ground::<FAST>(ai, a, 0, &mut env, facts, &mut out);
                continue;
            }
            // Any binding order finds the same tuples; sorted, they come in the nested-loop
            // order of `ground` (parameter by parameter, candidates ascending).
            if a.params.iter().any(|p| p.2.is_none()) {
                continue;
            }
            tuples.clear();
            self.ground_join(a, 0, &mut env, facts, &mut tuples);
            tuples.sort_unstable();
            tuples.dedup();
            out.extend(tuples.drain(..).map(|t| (ai, t)));
        }
        out
    }

    /// Fast path of [`Self::ground`]: binds next the unbound parameter with the fewest
    /// candidates (drawn from the facts of a positive literal whose other arguments are bound,
    /// a prefix range when its first argument is bound; else every object of the type) and checks
    /// each literal as soon as its parameters are bound.
    fn ground_join(&self, a: &Action, bound: u64, env: &mut Vec<u32>, facts: &Facts, out: &mut Vec<Vec<u32>>) {
        let n = a.params.len();
        if bound.count_ones() as usize == n {
            if a.rest.iter().all(|f| self.holds(f, env, facts)) && !self.is_noop_fast(a, env) {
                out.push(env[..n].to_vec());
            }
            return;
        }
        let is_bound = |k: usize| bound & (1u64 << k) != 0;
        // (cost, parameter, generator literal)
        let mut best: Option<(usize, usize, Option<usize>)> = None;
        for k in (0..n).filter(|&k| !is_bound(k)) {
            let mut choice = (self.objs(a.params[k].2).len() * 2, k, None);
            for (li, (_, f)) in a.literals.iter().enumerate() {
                let Formula::Atom(p, args) = f else { continue };
                if !args.contains(&Term::Var(k)) || args.contains(&Term::Missing) {
                    continue;
                }
                let others_bound = args.iter().all(|t| match t {
                    Term::Var(j) => *j == k || is_bound(*j),
                    _ => true,
                });
                if !others_bound {
                    continue;
                }
                let prefixed = !matches!(args.first(), Some(Term::Var(j)) if *j == k);
                let cost = if prefixed { 1 } else { facts[*p as usize].len() };
                if cost < choice.0 {
                    choice = (cost, k, Some(li));
                }
            }
            if best.is_none_or(|b| choice.0 < b.0) {
                best = Some(choice);
            }
        }
        let Some((_, k, gen)) = best else { return };
        let t = a.params[k].2.expect("typed parameters");
        let now = bound | (1u64 << k);
        let mut try_one = |o: u32, env: &mut Vec<u32>| {
            env[k] = o;
            // Literals whose parameters are all bound now and were not before.
            let ok = a
                .literals
                .iter()
                .zip(&a.literal_masks)
                .all(|((_, f), &m)| m & (1u64 << k) == 0 || m & !now != 0 || self.holds(f, env, facts));
            if ok {
                self.ground_join(a, now, env, facts, out);
            }
        };
        match gen {
            Some(li) => {
                let Formula::Atom(p, args) = &a.literals[li].1 else {
                    unreachable!()
                };
                let mut cands: Vec<u32> = Self::candidate_tuples(facts, *p, args, env, k)
                    .filter_map(|tuple| Self::match_free(args, tuple, env, k))
                    .filter(|&o| self.is_subtype(self.obj_type[o as usize], t))
                    .collect();
                cands.sort_unstable();
                cands.dedup();
                for o in cands {
                    try_one(o, env);
                }
            }
            None => {
                for &o in self.objs(Some(t)) {
                    try_one(o, env);
                }
            }
        }
        env[k] = u32::MAX;
    }

    fn ground<const FAST: bool>(
        &self,
        ai: usize,
        a: &Action,
        k: usize,
        env: &mut Vec<u32>,
        facts: &Facts,
        out: &mut Vec<(usize, Vec<u32>)>,
    ) {
        if k == a.params.len() {
            if a.rest.iter().all(|f| self.holds_g::<FAST>(f, env, facts)) && !self.is_noop(a, env) {
                out.push((ai, env[..a.params.len()].to_vec()));
            }
            return;
        }
        let generated: Vec<u32>;
        let cands: &[u32] = match a.generators[k] {
            Some(li) => {
                let Formula::Atom(p, args) = &a.literals[li].1 else {
                    unreachable!()
                };
                let Some(t) = a.params[k].2 else { return };
                let tuples = if FAST {
                    Self::candidate_tuples(facts, *p, args, env, k)
                } else {
                    facts[*p as usize].range::<[u32], _>(..)
                };
                let mut v: Vec<u32> = tuples
                    .filter(|tuple| {
                        tuple.len() == args.len()
                            && args.iter().zip(tuple.iter()).all(|(term, &o)| match term {
                                Term::Var(i) if *i == k => true,
                                other => Self::term(*other, env) == Some(o),
                            })
                    })
                    .filter_map(|tuple| args.iter().position(|t| *t == Term::Var(k)).map(|i| tuple[i]))
                    .filter(|&o| self.is_subtype(self.obj_type[o as usize], t))
                    .collect();
                v.sort_unstable();
                v.dedup();
                generated = v;
                &generated
            }
            None => self.objs(a.params[k].2),
        };
        for &o in cands {
            env[k] = o;
            if a.literals
                .iter()
                .filter(|(m, _)| *m == k)
                .all(|(_, f)| self.holds_g::<FAST>(f, env, facts))
            {
                self.ground::<FAST>(ai, a, k + 1, env, facts, out);
            }
        }
        env[k] = u32::MAX;
    }

    /// The PDDL translator drops operators whose effects all vanish: deletes that are also adds,
    /// and adds the precondition already requires (e.g. going to the location one is at).
    fn is_noop(&self, a: &Action, env: &[u32]) -> bool {
        let ground = |args: &[Term]| -> Option<Vec<u32>> { args.iter().map(|t| Self::term(*t, env)).collect() };
        let mut adds = Vec::new();
        let mut dels = Vec::new();
        for e in &a.effects {
            if e.condition.is_some() || !e.forall.is_empty() {
                return false;
            }
            let Some(g) = ground(&e.args) else { continue };
            if e.positive {
                adds.push((e.pred, g));
            } else {
                dels.push((e.pred, g));
            }
        }
        let pre: Vec<(u32, Vec<u32>)> = a
            .pre_atoms
            .iter()
            .filter_map(|(p, args)| ground(args).map(|g| (*p, g)))
            .collect();
        let real_dels = dels.iter().filter(|d| !adds.contains(d)).count();
        let real_adds = adds.iter().filter(|x| !pre.contains(x)).count();
        real_dels == 0 && real_adds == 0
    }

    /// [`Self::is_noop`] without building the grounded lists.
    fn is_noop_fast(&self, a: &Action, env: &[u32]) -> bool {
        if a.effects.iter().any(|e| e.condition.is_some() || !e.forall.is_empty()) {
            return false;
        }
        let grounded = |args: &[Term]| args.iter().all(|t| Self::term(*t, env).is_some());
        let same = |x: &[Term], y: &[Term]| {
            x.len() == y.len() && x.iter().zip(y).all(|(s, t)| Self::term(*s, env) == Self::term(*t, env))
        };
        let dels_cancelled = a.effects.iter().filter(|d| !d.positive && grounded(&d.args)).all(|d| {
            a.effects
                .iter()
                .any(|x| x.positive && x.pred == d.pred && grounded(&x.args) && same(&x.args, &d.args))
        });
        dels_cancelled
            && a.effects.iter().filter(|x| x.positive && grounded(&x.args)).all(|x| {
                a.pre_atoms
                    .iter()
                    .any(|(p, args)| *p == x.pred && grounded(args) && same(args, &x.args))
            })
    }

    fn apply(&self, ai: usize, args: &[u32], facts: &mut Facts) {
        self.apply_g::<true>(ai, args, facts)
    }

    fn apply_g<const FAST: bool>(&self, ai: usize, args: &[u32], facts: &mut Facts) {
        let a = &self.actions[ai];
        let mut env = vec![u32::MAX; a.slots.max(1)];
        env[..args.len()].copy_from_slice(args);
        let mut adds = Vec::new();
        let mut dels = Vec::new();
        for e in &a.effects {
            self.collect_effect::<FAST>(e, 0, &mut env, facts, &mut adds, &mut dels);
        }
        for (p, g) in dels {
            facts[p as usize].remove(&g);
            facts[self.neg_of[p as usize] as usize].insert(g);
        }
        for (p, g) in adds {
            facts[self.neg_of[p as usize] as usize].remove(&g);
            facts[p as usize].insert(g);
        }
    }

    fn collect_effect<const FAST: bool>(
        &self,
        e: &Effect,
        i: usize,
        env: &mut Vec<u32>,
        facts: &Facts,
        adds: &mut Vec<(u32, Vec<u32>)>,
        dels: &mut Vec<(u32, Vec<u32>)>,
    ) {
        if i < e.forall.len() {
            let (slot, t) = e.forall[i];
            if env.len() <= slot {
                env.resize(slot + 1, u32::MAX);
            }
            for &o in self.objs(t) {
                env[slot] = o;
                self.collect_effect::<FAST>(e, i + 1, env, facts, adds, dels);
            }
            env[slot] = u32::MAX;
            return;
        }
        if let Some(c) = &e.condition {
            if !self.holds_g::<FAST>(c, env, facts) {
                return;
            }
        }
        let g: Option<Vec<u32>> = e.args.iter().map(|t| Self::term(*t, env)).collect();
        if let Some(g) = g {
            if e.positive {
                adds.push((e.pred, g));
            } else {
                dels.push((e.pred, g));
            }
        }
    }

    fn goal_reached(&self, facts: &Facts) -> bool {
        let mut env = vec![u32::MAX; self.goal_slots.max(1)];
        self.holds(&self.goal, &mut env, facts)
    }

    /// Plain path of [`Self::goal_reached`].
    fn goal_reached_plain(&self, facts: &Facts) -> bool {
        let mut env = vec![u32::MAX; self.goal_slots.max(1)];
        self.holds_plain(&self.goal, &mut env, facts)
    }

    // ------------------------------------------------------------ text grammar

    fn action_ctx(&self, ai: usize, args: &[u32]) -> Ctx {
        let a = &self.actions[ai];
        let mut ctx = Ctx::default();
        for ((n, t, _), &o) in a.params.iter().zip(args) {
            ctx.mapping.push((n.clone(), t.clone(), o));
            ctx.set_var(n, o);
        }
        ctx
    }

    /// All matches of a conjunctive query, extending `ctx` (TextWorld's `State.all_assignments`:
    /// predicates in order, facts in sorted order, distinct placeholders bind distinct objects).
    fn query(&self, q: &Query, ctx: &Ctx, facts: &Facts) -> Vec<Ctx> {
        let mut out = Vec::new();
        let mut mapping = ctx.mapping.clone();
        self.query_rec(q, 0, &mut mapping, facts, &mut |m: &Binding| {
            let mut c = ctx.clone();
            for (n, t, o) in m {
                if !c.mapping.iter().any(|(n2, t2, _)| n2 == n && t2 == t) {
                    c.mapping.push((n.clone(), t.clone(), *o));
                }
                c.set_var(n, *o);
            }
            out.push(c);
            out.len() < 100_000
        });
        out
    }

    fn query_any(&self, q: &Query, ctx: &Ctx, facts: &Facts) -> bool {
        let mut found = false;
        let mut mapping = ctx.mapping.clone();
        self.query_rec(q, 0, &mut mapping, facts, &mut |_| {
            found = true;
            false
        });
        found
    }

    /// Returns false when the callback asked to stop.
    fn query_rec(
        &self,
        q: &Query,
        i: usize,
        mapping: &mut Binding,
        facts: &Facts,
        f: &mut dyn FnMut(&Binding) -> bool,
    ) -> bool {
        if i == q.preds.len() {
            return f(mapping);
        }
        let qp = &q.preds[i];
        let Some(pid) = self.pred(&qp.name) else { return true };
        let ptypes: Vec<Option<u32>> = qp.params.iter().map(|(_, t)| self.type_id(t)).collect();
        if ptypes.iter().any(Option::is_none) {
            return true;
        }
        'facts: for args in &facts[pid as usize] {
            if args.len() != qp.params.len() {
                continue;
            }
            let base = mapping.len();
            for (j, ((pn, pt), &o)) in qp.params.iter().zip(args).enumerate() {
                if !self.is_subtype(self.obj_type[o as usize], ptypes[j].unwrap()) {
                    mapping.truncate(base);
                    continue 'facts;
                }
                match mapping.iter().find(|(n, t, _)| n == pn && t == pt) {
                    Some((_, _, v)) => {
                        if *v != o {
                            mapping.truncate(base);
                            continue 'facts;
                        }
                    }
                    None => {
                        if mapping.iter().any(|(_, _, v)| *v == o) {
                            mapping.truncate(base);
                            continue 'facts;
                        }
                        mapping.push((pn.clone(), pt.clone(), o));
                    }
                }
            }
            let go_on = self.query_rec(q, i + 1, mapping, facts, f);
            mapping.truncate(base);
            if !go_on {
                return false;
            }
        }
        true
    }

    fn derive(&self, syms: &[Sym], ctx: &Ctx, facts: &Facts) -> Result<String, String> {
        let mut out = String::new();
        let mut budget = 200_000usize;
        for s in syms {
            self.derive_sym(s, ctx, facts, &mut out, 0, &mut budget)?;
        }
        Ok(out)
    }

    fn derive_nt(
        &self,
        name: &str,
        ctx: &Ctx,
        facts: &Facts,
        out: &mut String,
        depth: usize,
        budget: &mut usize,
    ) -> Result<(), String> {
        let prods = self
            .rules
            .get(name)
            .ok_or_else(|| format!("Can't find symbol '#{name}#' in the set of production rules."))?;
        let prod = prods
            .iter()
            .find(|p| p.condition.as_ref().is_none_or(|c| self.query_any(c, ctx, facts)))
            .ok_or_else(|| format!("no applicable production for '#{name}#'"))?;
        for s in &prod.rhs {
            self.derive_sym(s, ctx, facts, out, depth + 1, budget)?;
        }
        Ok(())
    }

    fn derive_expr(
        &self,
        e: &CondExpr,
        ctx: &Ctx,
        facts: &Facts,
        out: &mut String,
        depth: usize,
        budget: &mut usize,
    ) -> Result<(), String> {
        match e {
            CondExpr::Nonterminal(n) => self.derive_nt(n, ctx, facts, out, depth, budget),
            CondExpr::Eval(x) => {
                out.push_str(&self.eval(x, ctx)?.to_text(self));
                Ok(())
            }
        }
    }

    fn derive_sym(
        &self,
        s: &Sym,
        ctx: &Ctx,
        facts: &Facts,
        out: &mut String,
        depth: usize,
        budget: &mut usize,
    ) -> Result<(), String> {
        if depth > 100 || *budget == 0 || out.len() > 1 << 20 {
            return Err("text grammar recursion too deep".into());
        }
        *budget -= 1;
        match s {
            Sym::Terminal(t) => out.push_str(t),
            Sym::Nonterminal(n) => self.derive_nt(n, ctx, facts, out, depth, budget)?,
            Sym::Cond { expr, given } => match given {
                None => self.derive_expr(expr, ctx, facts, out, depth + 1, budget)?,
                Some(q) => {
                    for c in self.query(q, ctx, facts) {
                        self.derive_expr(expr, &c, facts, out, depth + 1, budget)?;
                    }
                }
            },
            Sym::List { expr, given } => {
                let items = match given {
                    None => vec![ctx.clone()],
                    Some(q) => self.query(q, ctx, facts),
                };
                match items.len() {
                    0 => self.derive_nt("list_empty", ctx, facts, out, depth + 1, budget)?,
                    n => {
                        for (i, c) in items.iter().enumerate() {
                            if i > 0 {
                                let sep = if i == n - 1 {
                                    "list_last_separator"
                                } else {
                                    "list_separator"
                                };
                                self.derive_nt(sep, ctx, facts, out, depth + 1, budget)?;
                            }
                            self.derive_expr(expr, c, facts, out, depth + 1, budget)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn eval(&self, e: &Expr, ctx: &Ctx) -> Result<Value, String> {
        Ok(match e {
            Expr::Str(s) => Value::Str(s.clone()),
            Expr::Var(v) => Value::Obj(ctx.var(v).ok_or_else(|| format!("name '{v}' is not defined"))?),
            Expr::Attr(v, a) => {
                let o = ctx.var(v).ok_or_else(|| format!("name '{v}' is not defined"))?;
                Value::Str(match a.as_str() {
                    "name" => self.names[o as usize].clone(),
                    "id" => self.objects[o as usize].clone(),
                    "indefinite" => "a".into(),
                    "definite" => "the".into(),
                    "type" => self.types.names[self.obj_type[o as usize] as usize].clone(),
                    other => return Err(format!("unknown attribute '{other}'")),
                })
            }
            Expr::Add(a, b) => match (self.eval(a, ctx)?, self.eval(b, ctx)?) {
                (Value::Str(x), Value::Str(y)) => Value::Str(x + &y),
                _ => return Err("can only concatenate str".into()),
            },
            Expr::Or(a, b) => {
                let x = self.eval(a, ctx)?;
                if x.truthy() {
                    x
                } else {
                    self.eval(b, ctx)?
                }
            }
        })
    }
}

enum Value {
    Str(String),
    Obj(u32),
}

impl Value {
    fn truthy(&self) -> bool {
        match self {
            Value::Str(s) => !s.is_empty(),
            Value::Obj(_) => true,
        }
    }
    fn to_text(&self, spec: &GameSpec) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::Obj(o) => spec.names[*o as usize].clone(),
        }
    }
}

/// A derivation context: bound placeholders (name, type, object) and variables (name -> object).
#[derive(Clone, Debug, Default)]
struct Ctx {
    mapping: Vec<(String, String, u32)>,
    vars: Vec<(String, u32)>,
}

impl Ctx {
    fn set_var(&mut self, n: &str, o: u32) {
        match self.vars.iter_mut().find(|(k, _)| k == n) {
            Some(slot) => slot.1 = o,
            None => self.vars.push((n.to_string(), o)),
        }
    }
    fn var(&self, n: &str) -> Option<u32> {
        self.vars.iter().find(|(k, _)| k == n).map(|(_, o)| *o)
    }
}

/// Python's `str.strip()` whitespace.
fn py_strip(s: &str) -> &str {
    let ws = |c: char| c.is_whitespace() || matches!(c, '\x1c'..='\x1f');
    s.trim_matches(ws)
}

/// One playable ALFWorld game.
#[derive(Clone, Debug)]
pub struct AlfworldEnv {
    spec: Arc<GameSpec>,
    max_steps: usize,
    facts: Facts,
    /// Applicable grounded actions of the current state and their commands (same order).
    valid: Vec<(usize, Vec<u32>)>,
    commands: Vec<Arc<str>>,
    admissible: Vec<String>,
    steps: usize,
    last: Option<EnvStep>,
    /// Plays with the plain reference code paths (no caches, no shortcuts).
    reference: bool,
    /// This env's own copies of the cached command texts it has met. The game's cache is shared
    /// by the envs of a group, which the pool steps on different threads at the same time: its
    /// lock word and the texts' reference counts are written on every use, and the cache line
    /// moving between cores made a step ~30 % slower on 2 threads than on 1.
    texts: CommandCache,
}

/// The env's own copy of the text of `key` (see `AlfworldEnv::texts`), made from `shared()`
/// the first time; actions without a key get `shared()` as it is.
fn own_text(texts: &mut CommandCache, key: Option<CommandKey>, shared: impl FnOnce() -> Arc<str>) -> Arc<str> {
    let Some(key) = key else { return shared() };
    if let Some(t) = texts.get(&key) {
        return t.clone();
    }
    let t: Arc<str> = Arc::from(&*shared());
    if texts.len() < ENV_TEXTS {
        texts.insert(key, t.clone());
    }
    t
}

impl AlfworldEnv {
    pub fn new(spec: Arc<GameSpec>, max_steps: usize) -> AlfworldEnv {
        let facts = spec.init.clone();
        let mut env = AlfworldEnv {
            spec,
            max_steps,
            facts,
            valid: Vec::new(),
            commands: Vec::new(),
            admissible: Vec::new(),
            steps: 0,
            last: None,
            reference: false,
            texts: CommandCache::default(),
        };
        env.refresh();
        env
    }

    /// The same game played by the plain reference code paths: every admissible command derived
    /// from the grammar afresh after every step. Slow; the differential tests and benchmarks
    /// compare [`AlfworldEnv::new`] with it.
    pub fn new_reference(spec: Arc<GameSpec>, max_steps: usize) -> AlfworldEnv {
        let mut env = AlfworldEnv::new(spec, max_steps);
        env.reference = true;
        env.refresh();
        env
    }

    pub fn spec(&self) -> &Arc<GameSpec> {
        &self.spec
    }
    pub fn max_steps(&self) -> usize {
        self.max_steps
    }
    /// Sorted, de-duplicated admissible commands of the current state.
    pub fn admissible_commands(&self) -> &[String] {
        &self.admissible
    }
    /// Steps taken since the last reset (every command counts, admissible or not).
    pub fn steps(&self) -> usize {
        self.steps
    }
    pub fn won(&self) -> bool {
        if self.reference {
            self.spec.goal_reached_plain(&self.facts)
        } else {
            self.spec.goal_reached(&self.facts)
        }
    }
    pub fn is_done(&self) -> bool {
        self.last.as_ref().is_some_and(|l| l.done)
    }

    fn refresh(&mut self) {
        if self.reference {
            return self.refresh_plain();
        }
        let valid = self.spec.applicable(&self.facts);
        // `valid` is sorted by (action, arguments): a merge with the previous state's list finds
        // the commands that can be kept (static templates). Kept commands are moved, not cloned:
        // the texts are shared by the envs of a game, and their reference counts would otherwise
        // bounce between the threads that step those envs at the same time.
        let mut commands = Vec::with_capacity(valid.len());
        let old_valid = std::mem::take(&mut self.valid);
        let mut old = std::mem::take(&mut self.commands).into_iter().zip(old_valid).peekable();
        let mut same = true; // the same texts in the same order (the admissible list stands)
        for (ai, args) in &valid {
            while old.next_if(|(_, (a, x))| (*a, x) < (*ai, args)).is_some() {
                same = false;
            }
            let matched = old.next_if(|(_, (a, x))| a == ai && x == args).map(|(text, _)| text);
            let text = match matched {
                Some(text) if self.spec.static_template[*ai] => text,
                matched => {
                    let (spec, facts) = (&self.spec, &self.facts);
                    let key = spec.command_key(*ai, args);
                    let text = own_text(&mut self.texts, key, || spec.command_text(*ai, args, facts));
                    same &= matched.is_some_and(|m| m == text);
                    text
                }
            };
            commands.push(text);
        }
        same &= old.next().is_none();
        self.valid = valid;
        self.commands = commands;
        if !same {
            self.admissible = Self::sorted_unique(&self.commands);
        }
    }

    fn sorted_unique(commands: &[Arc<str>]) -> Vec<String> {
        let mut order: Vec<&str> = commands.iter().map(|c| &**c).collect();
        order.sort_unstable();
        order.dedup();
        order.into_iter().map(str::to_string).collect()
    }

    /// Plain path of [`Self::refresh`]: every command derived from the grammar afresh.
    fn refresh_plain(&mut self) {
        self.valid = self.spec.applicable_plain(&self.facts);
        self.commands = self
            .valid
            .iter()
            .map(|(ai, args)| {
                let ctx = self.spec.action_ctx(*ai, args);
                self.spec
                    .derive(&self.spec.actions[*ai].template, &ctx, &self.facts)
                    .unwrap_or_else(|e| format!("<{e}>"))
                    .into()
            })
            .collect();
        let set: BTreeSet<&str> = self.commands.iter().map(|c| &**c).collect();
        self.admissible = set.into_iter().map(str::to_string).collect();
    }

    fn snapshot(&self, obs: String) -> EnvStep {
        let won = self.won();
        EnvStep {
            obs,
            admissible: self.admissible.clone(),
            score: if won { 1.0 } else { 0.0 },
            done: won || self.steps >= self.max_steps,
            won,
            has_search_bar: false,
        }
    }

    /// The command the expert would play now, then the rest of its plan.
    pub fn expert_plan(&self) -> Option<Vec<String>> {
        expert::plan(self)
    }
}

impl TextEnv for AlfworldEnv {
    fn reset(&mut self) -> EnvStep {
        self.facts = self.spec.init.clone();
        self.steps = 0;
        self.last = None;
        if !self.reference {
            // Borrowed, not cloned: an `Arc` clone is a write to the count that every env of the
            // game shares.
            let spec = &self.spec;
            let init = spec.initial.get_or_init(|| {
                let mut fresh = AlfworldEnv::new(spec.clone(), 0);
                fresh.refresh();
                let intro = spec
                    .derive(&[Sym::Nonterminal("intro".into())], &Ctx::default(), &fresh.facts)
                    .unwrap_or_else(|e| format!("<{e}>"));
                Initial {
                    valid: fresh.valid,
                    commands: fresh.commands,
                    admissible: fresh.admissible,
                    intro,
                }
            });
            self.valid.clone_from(&init.valid);
            self.commands.clear();
            for ((ai, args), text) in init.valid.iter().zip(&init.commands) {
                let key = spec.command_key(*ai, args);
                self.commands
                    .push(own_text(&mut self.texts, key, || Arc::from(&**text)));
            }
            self.admissible.clone_from(&init.admissible);
            let mut s = self.snapshot(init.intro.clone());
            s.done = s.won;
            return s;
        }
        self.refresh();
        let obs = self
            .spec
            .derive(&[Sym::Nonterminal("intro".into())], &Ctx::default(), &self.facts)
            .unwrap_or_else(|e| format!("<{e}>"));
        let mut s = self.snapshot(obs);
        // Reset never reports done (the step limit applies to steps).
        s.done = s.won;
        s
    }

    fn step(&mut self, command: &str) -> EnvStep {
        if let Some(last) = &self.last {
            if last.done {
                return last.clone();
            }
        }
        let cmd = py_strip(command);
        let obs = match self.commands.iter().position(|c| &**c == cmd) {
            Some(i) => {
                let (ai, args) = self.valid[i].clone();
                if self.reference {
                    self.spec.apply_g::<false>(ai, &args, &mut self.facts);
                } else {
                    self.spec.apply(ai, &args, &mut self.facts);
                }
                let ctx = self.spec.action_ctx(ai, &args);
                let obs = self
                    .spec
                    .derive(&self.spec.actions[ai].feedback, &ctx, &self.facts)
                    .unwrap_or_else(|e| format!("<{e}>"));
                self.refresh();
                obs
            }
            None => "Nothing happens.".to_string(),
        };
        self.steps += 1;
        let s = self.snapshot(obs);
        // Only a finished game replays its last state.
        if s.done {
            self.last = Some(s.clone());
        }
        s
    }

    fn task_type(&self) -> &str {
        &self.spec.task_type
    }

    fn task(&self) -> &str {
        &self.spec.task
    }
}

#[cfg(test)]
mod tests;

//! PDDL reading: an s-expression reader plus the domain/problem subset that TextWorld's PDDL games
//! use (typed objects, `and`/`or`/`not`/`exists`/`forall`/`=` formulas, conditional effects).
//!
//! Like Fast Downward (which the reference engine uses), every name is lowercased and tokens are
//! split on whitespace and parentheses only, so `?l - location,` declares a variable of the type
//! `location,` (which has no objects).

use std::collections::HashMap;

/// An s-expression.
#[derive(Clone, Debug, PartialEq)]
pub enum SExpr {
    Atom(String),
    List(Vec<SExpr>),
}

impl SExpr {
    pub fn as_atom(&self) -> Option<&str> {
        match self {
            SExpr::Atom(s) => Some(s),
            SExpr::List(_) => None,
        }
    }
    pub fn as_list(&self) -> Option<&[SExpr]> {
        match self {
            SExpr::List(v) => Some(v),
            SExpr::Atom(_) => None,
        }
    }
}

/// Parses one s-expression (comments start with `;`); names are lowercased.
pub fn parse_sexpr(text: &str) -> Result<SExpr, String> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let line = match line.find(';') {
            Some(i) => &line[..i],
            None => line,
        };
        for ch in line.chars() {
            if ch == '(' || ch == ')' || ch.is_whitespace() {
                if !cur.is_empty() {
                    tokens.push(std::mem::take(&mut cur));
                }
                if ch == '(' || ch == ')' {
                    tokens.push(ch.to_string());
                }
            } else {
                cur.extend(ch.to_lowercase());
            }
        }
        if !cur.is_empty() {
            tokens.push(std::mem::take(&mut cur));
        }
    }
    let mut pos = 0;
    let expr = read(&tokens, &mut pos, 0)?;
    if pos != tokens.len() {
        return Err(format!("unexpected text after the closing parenthesis (token {pos})"));
    }
    Ok(expr)
}

fn read(tokens: &[String], pos: &mut usize, depth: usize) -> Result<SExpr, String> {
    if depth > 200 {
        return Err("expression nested too deeply".into());
    }
    let tok = tokens.get(*pos).ok_or("unexpected end of text (missing `)`?)")?;
    *pos += 1;
    match tok.as_str() {
        "(" => {
            let mut items = Vec::new();
            loop {
                match tokens.get(*pos).map(String::as_str) {
                    None => return Err("unexpected end of text (missing `)`)".into()),
                    Some(")") => {
                        *pos += 1;
                        return Ok(SExpr::List(items));
                    }
                    Some(_) => items.push(read(tokens, pos, depth + 1)?),
                }
            }
        }
        ")" => Err("unexpected `)`".into()),
        _ => Ok(SExpr::Atom(tok.clone())),
    }
}

/// A typed variable list `?a ?b - t ?c - u` (untyped entries get `object`).
pub fn parse_typed_list(items: &[SExpr]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let a = items[i].as_atom().ok_or("expected a name in a typed list")?;
        if a == "-" {
            let t = items
                .get(i + 1)
                .and_then(SExpr::as_atom)
                .ok_or("expected a type after `-`")?;
            for p in pending.drain(..) {
                out.push((p, t.to_string()));
            }
            i += 2;
        } else {
            pending.push(a.to_string());
            i += 1;
        }
    }
    for p in pending {
        out.push((p, "object".to_string()));
    }
    Ok(out)
}

/// A raw (not yet compiled) formula.
#[derive(Clone, Debug)]
pub enum RawFormula {
    True,
    And(Vec<RawFormula>),
    Or(Vec<RawFormula>),
    Not(Box<RawFormula>),
    Imply(Box<RawFormula>, Box<RawFormula>),
    Atom(String, Vec<String>),
    Exists(Vec<(String, String)>, Box<RawFormula>),
    Forall(Vec<(String, String)>, Box<RawFormula>),
}

pub fn parse_formula(e: &SExpr) -> Result<RawFormula, String> {
    let l = e.as_list().ok_or("expected a parenthesised formula")?;
    if l.is_empty() {
        return Ok(RawFormula::True);
    }
    let head = l[0].as_atom().ok_or("expected a predicate or connective name")?;
    let sub = |xs: &[SExpr]| xs.iter().map(parse_formula).collect::<Result<Vec<_>, _>>();
    Ok(match head {
        "and" => RawFormula::And(sub(&l[1..])?),
        "or" => RawFormula::Or(sub(&l[1..])?),
        "not" => {
            if l.len() != 2 {
                return Err("`not` takes one formula".into());
            }
            RawFormula::Not(Box::new(parse_formula(&l[1])?))
        }
        "imply" => {
            if l.len() != 3 {
                return Err("`imply` takes two formulas".into());
            }
            RawFormula::Imply(Box::new(parse_formula(&l[1])?), Box::new(parse_formula(&l[2])?))
        }
        "exists" | "forall" => {
            if l.len() != 3 {
                return Err(format!("`{head}` takes a variable list and a formula"));
            }
            let vars = parse_typed_list(l[1].as_list().ok_or("expected a variable list")?)?;
            let body = Box::new(parse_formula(&l[2])?);
            if head == "exists" {
                RawFormula::Exists(vars, body)
            } else {
                RawFormula::Forall(vars, body)
            }
        }
        _ => {
            let args = l[1..]
                .iter()
                .map(|a| a.as_atom().map(str::to_string).ok_or("expected a term"))
                .collect::<Result<Vec<_>, _>>()?;
            RawFormula::Atom(head.to_string(), args)
        }
    })
}

/// One literal of an effect, possibly conditional and universally quantified.
#[derive(Clone, Debug)]
pub struct RawEffect {
    pub forall: Vec<(String, String)>,
    pub condition: Option<RawFormula>,
    pub positive: bool,
    pub pred: String,
    pub args: Vec<String>,
}

pub fn parse_effect(
    e: &SExpr,
    forall: &[(String, String)],
    cond: Option<&RawFormula>,
    out: &mut Vec<RawEffect>,
) -> Result<(), String> {
    let l = e.as_list().ok_or("expected a parenthesised effect")?;
    if l.is_empty() {
        return Ok(());
    }
    let head = l[0].as_atom().ok_or("expected an effect name")?;
    match head {
        "and" => {
            for x in &l[1..] {
                parse_effect(x, forall, cond, out)?;
            }
        }
        "increase" | "decrease" | "assign" | "scale-up" | "scale-down" => {}
        "when" => {
            if l.len() != 3 {
                return Err("`when` takes a condition and an effect".into());
            }
            let c = parse_formula(&l[1])?;
            let c = match cond {
                Some(prev) => RawFormula::And(vec![prev.clone(), c]),
                None => c,
            };
            parse_effect(&l[2], forall, Some(&c), out)?;
        }
        "forall" => {
            if l.len() != 3 {
                return Err("`forall` takes a variable list and an effect".into());
            }
            let mut vars = forall.to_vec();
            vars.extend(parse_typed_list(l[1].as_list().ok_or("expected a variable list")?)?);
            parse_effect(&l[2], &vars, cond, out)?;
        }
        "not" => {
            let inner = l.get(1).and_then(SExpr::as_list).ok_or("`not` needs an atom")?;
            let p = inner.first().and_then(SExpr::as_atom).ok_or("`not` needs an atom")?;
            out.push(RawEffect {
                forall: forall.to_vec(),
                condition: cond.cloned(),
                positive: false,
                pred: p.to_string(),
                args: atoms(&inner[1..])?,
            });
        }
        _ => out.push(RawEffect {
            forall: forall.to_vec(),
            condition: cond.cloned(),
            positive: true,
            pred: head.to_string(),
            args: atoms(&l[1..])?,
        }),
    }
    Ok(())
}

fn atoms(xs: &[SExpr]) -> Result<Vec<String>, String> {
    xs.iter()
        .map(|a| {
            a.as_atom()
                .map(str::to_string)
                .ok_or_else(|| "expected a term".to_string())
        })
        .collect()
}

#[derive(Clone, Debug)]
pub struct RawAction {
    pub name: String,
    pub params: Vec<(String, String)>,
    pub precondition: RawFormula,
    pub effects: Vec<RawEffect>,
}

#[derive(Clone, Debug, Default)]
pub struct RawDomain {
    /// type -> parent type
    pub types: Vec<(String, String)>,
    pub constants: Vec<(String, String)>,
    pub actions: Vec<RawAction>,
}

pub fn parse_domain(text: &str) -> Result<RawDomain, String> {
    let e = parse_sexpr(text)?;
    let l = e.as_list().ok_or("the domain is not a list")?;
    if l.first().and_then(SExpr::as_atom) != Some("define") {
        return Err("the domain does not start with `(define`".into());
    }
    let mut d = RawDomain::default();
    for part in &l[1..] {
        let Some(p) = part.as_list() else { continue };
        match p.first().and_then(SExpr::as_atom) {
            Some(":types") => d.types = parse_typed_list(&p[1..])?,
            Some(":constants") => d.constants = parse_typed_list(&p[1..])?,
            Some(":action") => {
                let name = p.get(1).and_then(SExpr::as_atom).ok_or("action without a name")?;
                let mut a = RawAction {
                    name: name.to_string(),
                    params: Vec::new(),
                    precondition: RawFormula::True,
                    effects: Vec::new(),
                };
                let mut i = 2;
                while i + 1 < p.len() {
                    let key = p[i].as_atom().ok_or("expected an action keyword")?;
                    let val = &p[i + 1];
                    let ctx = |m: String| format!("action `{name}` {key}: {m}");
                    match key {
                        ":parameters" => {
                            a.params = parse_typed_list(val.as_list().ok_or_else(|| ctx("expected a list".into()))?)
                                .map_err(ctx)?
                        }
                        ":precondition" => a.precondition = parse_formula(val).map_err(ctx)?,
                        ":effect" => parse_effect(val, &[], None, &mut a.effects).map_err(ctx)?,
                        _ => {}
                    }
                    i += 2;
                }
                d.actions.push(a);
            }
            _ => {}
        }
    }
    Ok(d)
}

#[derive(Clone, Debug, Default)]
pub struct RawProblem {
    pub objects: Vec<(String, String)>,
    pub init: Vec<(String, Vec<String>)>,
    pub goal: Option<RawFormula>,
}

pub fn parse_problem(text: &str) -> Result<RawProblem, String> {
    let e = parse_sexpr(text)?;
    let l = e.as_list().ok_or("the problem is not a list")?;
    if l.first().and_then(SExpr::as_atom) != Some("define") {
        return Err("the problem does not start with `(define`".into());
    }
    let mut p = RawProblem::default();
    for part in &l[1..] {
        let Some(x) = part.as_list() else { continue };
        match x.first().and_then(SExpr::as_atom) {
            Some(":objects") => p.objects = parse_typed_list(&x[1..])?,
            Some(":init") => {
                for f in &x[1..] {
                    let Some(fl) = f.as_list() else {
                        return Err(":init holds a non-list".into());
                    };
                    let Some(head) = fl.first().and_then(SExpr::as_atom) else {
                        continue;
                    };
                    // Numeric fluents `(= (f ..) v)` are not facts.
                    if head == "=" {
                        continue;
                    }
                    p.init
                        .push((head.to_string(), atoms(&fl[1..]).map_err(|e| format!(":init: {e}"))?));
                }
            }
            Some(":goal") => {
                let g = x.get(1).ok_or(":goal is empty")?;
                p.goal = Some(parse_formula(g).map_err(|e| format!(":goal: {e}"))?);
            }
            _ => {}
        }
    }
    Ok(p)
}

/// Interns strings to dense ids.
#[derive(Clone, Debug, Default)]
pub struct Interner {
    pub names: Vec<String>,
    pub ids: HashMap<String, u32>,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(s.to_string());
        self.ids.insert(s.to_string(), i);
        i
    }
    pub fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }
}

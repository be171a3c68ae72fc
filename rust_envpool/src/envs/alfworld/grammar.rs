//! The TextWorld PDDL grammar file (`grammar` key of a game): the action document
//! (`action Name { template :: "..."; feedback :: "..."; grammar :: """{json}"""; }` and top-level
//! `grammar :: """{json}""";` blocks) and the context-sensitive text grammar it defines.
//!
//! Symbol language (as in TextWorld's `textgen.ebnf`): plain text, `#rule#` non-terminals,
//! `{expression}` / `{expression | query}` conditional symbols (one expansion per query match) and
//! `[ {...} ]` list symbols (joined with the `list_separator` / `list_last_separator` rules,
//! `list_empty` when empty). Expressions are the tiny Python subset the games use:
//! `x`, `x.name`, `x.id`, `x.indefinite`, `x.definite`, `'literal'`, `a + b`, `a or b`.

use std::collections::HashMap;

/// A parsed text symbol.
#[derive(Clone, Debug, PartialEq)]
pub enum Sym {
    Terminal(String),
    Nonterminal(String),
    Cond { expr: CondExpr, given: Option<Query> },
    List { expr: CondExpr, given: Option<Query> },
}

#[derive(Clone, Debug, PartialEq)]
pub enum CondExpr {
    Nonterminal(String),
    Eval(Expr),
}

/// A conjunctive query `pred(x:type, y:type) & not_pred(x:type)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    pub preds: Vec<QueryPred>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct QueryPred {
    pub name: String,
    /// (placeholder name, placeholder type)
    pub params: Vec<(String, String)>,
}

/// A grammar production.
#[derive(Clone, Debug)]
pub struct Production {
    pub condition: Option<Query>,
    pub rhs: Vec<Sym>,
}

/// One `action` block of the grammar document.
#[derive(Clone, Debug, Default)]
pub struct ActionText {
    pub name: String,
    pub template: Vec<Sym>,
    pub feedback: Vec<Sym>,
}

/// Everything the grammar file defines.
#[derive(Clone, Debug, Default)]
pub struct GrammarDoc {
    /// Lowercased action name -> its template and feedback.
    pub actions: HashMap<String, ActionText>,
    pub rules: HashMap<String, Vec<Production>>,
}

/// Expression subset used by `{...}` symbols.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Var(String),
    Attr(String, String),
    Str(String),
    Add(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
}

// ---------------------------------------------------------------- document

struct Scanner<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }
    /// Whitespace and `#...` end-of-line comments.
    fn skip(&mut self) {
        loop {
            let r = self.rest();
            let t = r.trim_start();
            self.pos += r.len() - t.len();
            if self.rest().starts_with('#') {
                match self.rest().find('\n') {
                    Some(i) => self.pos += i,
                    None => self.pos = self.s.len(),
                }
            } else {
                break;
            }
        }
    }
    fn eat(&mut self, tok: &str) -> bool {
        self.skip();
        if self.rest().starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }
    fn expect(&mut self, tok: &str) -> Result<(), String> {
        if self.eat(tok) {
            Ok(())
        } else {
            Err(format!("expected `{tok}` at byte {}", self.pos))
        }
    }
    fn name(&mut self) -> Result<&'a str, String> {
        self.skip();
        let r = self.rest();
        let n = r
            .char_indices()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '/' || *c == '-'))
            .map(|(i, _)| i)
            .unwrap_or(r.len());
        if n == 0 {
            return Err(format!("expected a name at byte {}", self.pos));
        }
        self.pos += n;
        Ok(&r[..n])
    }
    fn str_lit(&mut self) -> Result<&'a str, String> {
        self.skip();
        let r = self.rest();
        if !r.starts_with('"') {
            return Err(format!("expected a string at byte {}", self.pos));
        }
        let end = r[1..]
            .find('"')
            .ok_or_else(|| format!("unterminated string at byte {}", self.pos))?;
        self.pos += end + 2;
        Ok(&r[1..end + 1])
    }
    fn block(&mut self) -> Result<&'a str, String> {
        self.skip();
        let r = self.rest();
        if !r.starts_with("\"\"\"") {
            return Err(format!("expected a \"\"\"block\"\"\" at byte {}", self.pos));
        }
        let end = r[3..]
            .find("\"\"\"")
            .ok_or_else(|| format!("unterminated \"\"\" block at byte {}", self.pos))?;
        self.pos += end + 6;
        Ok(&r[3..end + 3])
    }
}

fn merge_json(
    text: &str,
    strip_comments: bool,
    into: &mut HashMap<String, Vec<(Option<String>, String)>>,
) -> Result<(), String> {
    let data: String = if strip_comments {
        text.split('\n')
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        text.to_string()
    };
    let v: serde_json::Value = serde_json::from_str(&data).map_err(|e| format!("grammar JSON: {e}"))?;
    let obj = v.as_object().ok_or("a grammar block is not a JSON object")?;
    for (k, rules) in obj {
        let arr = rules
            .as_array()
            .ok_or_else(|| format!("grammar rule `{k}` is not a list"))?;
        let mut out = Vec::new();
        for r in arr {
            let rhs = r
                .get("rhs")
                .and_then(|x| x.as_str())
                .ok_or_else(|| format!("grammar rule `{k}` lacks a string `rhs`"))?;
            let cond = r.get("condition").and_then(|x| x.as_str()).filter(|c| !c.is_empty());
            out.push((cond.map(str::to_string), rhs.to_string()));
        }
        into.insert(k.clone(), out);
    }
    Ok(())
}

/// Parses the grammar document.
pub fn parse_document(text: &str) -> Result<GrammarDoc, String> {
    let mut sc = Scanner { s: text, pos: 0 };
    let mut raw_rules: HashMap<String, Vec<(Option<String>, String)>> = HashMap::new();
    let mut doc = GrammarDoc::default();
    loop {
        sc.skip();
        if sc.rest().is_empty() {
            break;
        }
        if sc.rest().starts_with("action") {
            sc.pos += "action".len();
            let name = sc.name()?.to_string();
            sc.expect("{")?;
            let mut template = None;
            let mut feedback = None;
            loop {
                if sc.eat("}") {
                    break;
                }
                let key = sc.name().map_err(|e| format!("action `{name}`: {e}"))?;
                sc.expect("::")?;
                match key {
                    "template" => template = Some(sc.str_lit()?.to_string()),
                    "feedback" => feedback = Some(sc.str_lit()?.to_string()),
                    "pddl" => {
                        sc.block()?;
                    }
                    "grammar" => {
                        merge_json(sc.block()?, true, &mut raw_rules).map_err(|e| format!("action `{name}`: {e}"))?
                    }
                    other => return Err(format!("action `{name}`: unknown entry `{other}`")),
                }
                sc.expect(";")?;
            }
            let template = template.ok_or_else(|| format!("action `{name}` has no template"))?;
            let feedback = feedback.ok_or_else(|| format!("action `{name}` has no feedback"))?;
            doc.actions.insert(
                name.to_lowercase(),
                ActionText {
                    name: name.clone(),
                    template: parse_symbols(&template),
                    feedback: parse_symbols(&feedback),
                },
            );
        } else if sc.rest().starts_with("grammar") {
            sc.pos += "grammar".len();
            sc.expect("::")?;
            let b = sc.block()?;
            merge_json(b, false, &mut raw_rules)?;
            sc.expect(";")?;
        } else {
            return Err(format!("unexpected text at byte {}", sc.pos));
        }
    }
    for (k, rules) in raw_rules {
        let prods = rules
            .into_iter()
            .map(|(c, rhs)| {
                Ok(Production {
                    condition: match c {
                        Some(c) => Some(parse_query(&c).map_err(|e| format!("rule `{k}` condition: {e}"))?),
                        None => None,
                    },
                    rhs: parse_symbols(&rhs),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        doc.rules.insert(k, prods);
    }
    Ok(doc)
}

// ---------------------------------------------------------------- symbols

struct SymParser<'a> {
    s: &'a str,
    pos: usize,
}

fn is_literal_char(c: char) -> bool {
    !matches!(c, ';' | '|' | '"' | '<' | '>' | '[' | ']' | '#' | '{' | '}')
}

impl<'a> SymParser<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }
    /// TatSu's token skipping for this grammar: tabs, and at a line start `//...` lines or blank
    /// space up to and including one newline.
    fn skip(&mut self) {
        loop {
            let start = self.pos;
            while self.rest().starts_with('\t') {
                self.pos += 1;
            }
            let at_line_start = self.pos == 0 || self.s[..self.pos].ends_with('\n');
            if at_line_start {
                let r = self.rest();
                if r.starts_with("//") {
                    self.pos += r.find('\n').unwrap_or(r.len());
                } else {
                    let t = r.trim_start_matches(|c: char| c.is_whitespace());
                    self.pos += r.len() - t.len();
                }
                if self.rest().starts_with('\n') {
                    self.pos += 1;
                }
            }
            if self.pos == start {
                break;
            }
        }
    }
    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &'a str {
        let r = self.rest();
        let n = r
            .char_indices()
            .find(|(_, c)| !f(*c))
            .map(|(i, _)| i)
            .unwrap_or(r.len());
        self.pos += n;
        &r[..n]
    }
    fn nonterminal(&mut self) -> Option<String> {
        let save = self.pos;
        self.skip();
        if !self.rest().starts_with('#') {
            self.pos = save;
            return None;
        }
        self.pos += 1;
        self.skip();
        let tag = self.take_while(|c| c.is_alphanumeric() || c == '_' || "()/!<>-,.".contains(c) || c.is_whitespace());
        if tag.is_empty() || !self.rest().starts_with('#') {
            self.pos = save;
            return None;
        }
        self.pos += 1;
        Some(tag.to_string())
    }
    fn conditional(&mut self) -> Option<(CondExpr, Option<Query>)> {
        let save = self.pos;
        self.skip();
        if !self.rest().starts_with('{') {
            self.pos = save;
            return None;
        }
        self.pos += 1;
        let expr = if let Some(nt) = self.nonterminal() {
            CondExpr::Nonterminal(nt)
        } else {
            self.skip();
            let st = self.take_while(|c| !matches!(c, '|' | '[' | ']' | '{' | '}' | '\n' | '<' | '>'));
            if st.is_empty() {
                self.pos = save;
                return None;
            }
            match parse_expr(st) {
                Ok(e) => CondExpr::Eval(e),
                Err(_) => CondExpr::Eval(Expr::Str(format!("<bad expression {st}>"))),
            }
        };
        let mut given = None;
        let p2 = self.pos;
        self.take_while(char::is_whitespace);
        if self.rest().starts_with('|') {
            self.pos += 1;
            self.take_while(char::is_whitespace);
            self.skip();
            let g = self.take_while(|c| !matches!(c, ';' | '|' | '{' | '}' | '\n' | '[' | ']' | '#'));
            if g.is_empty() {
                self.pos = save;
                return None;
            }
            given = Some(parse_query(g).unwrap_or(Query {
                preds: vec![QueryPred {
                    name: String::new(),
                    params: vec![],
                }],
            }));
        } else {
            self.pos = p2;
        }
        self.skip();
        if !self.rest().starts_with('}') {
            self.pos = save;
            return None;
        }
        self.pos += 1;
        Some((expr, given))
    }
    fn symbol(&mut self) -> Option<Sym> {
        let save = self.pos;
        // list
        self.skip();
        if self.rest().starts_with('[') {
            self.pos += 1;
            if let Some((expr, given)) = self.conditional() {
                self.skip();
                if self.rest().starts_with(']') {
                    self.pos += 1;
                    return Some(Sym::List { expr, given });
                }
            }
        }
        self.pos = save;
        if let Some((expr, given)) = self.conditional() {
            return Some(Sym::Cond { expr, given });
        }
        if let Some(nt) = self.nonterminal() {
            return Some(Sym::Nonterminal(nt));
        }
        self.skip();
        if self.rest().starts_with('"') {
            let p = self.pos;
            self.pos += 1;
            let lit = self.take_while(is_literal_char);
            if self.rest().starts_with('"') {
                self.pos += 1;
                return Some(Sym::Terminal(lit.replace("\\n", "\n")));
            }
            self.pos = p;
        }
        let lit = self.take_while(is_literal_char);
        if lit.is_empty() {
            self.pos = save;
            return None;
        }
        Some(Sym::Terminal(lit.replace("\\n", "\n")))
    }
}

/// Parses symbol text; like the reference parser it stops at the first text it cannot read.
pub fn parse_symbols(text: &str) -> Vec<Sym> {
    let mut p = SymParser { s: text, pos: 0 };
    let mut out = Vec::new();
    while let Some(s) = p.symbol() {
        out.push(s);
        if p.pos >= text.len() {
            break;
        }
    }
    out
}

/// Parses `pred(x:type, ...) & ...`.
pub fn parse_query(text: &str) -> Result<Query, String> {
    let mut preds = Vec::new();
    for part in text.split('&') {
        let part = part.trim();
        let open = part.find('(').ok_or_else(|| format!("expected `(` in `{part}`"))?;
        if !part.ends_with(')') {
            return Err(format!("expected `)` at the end of `{part}`"));
        }
        let name = part[..open].trim().to_string();
        let inner = &part[open + 1..part.len() - 1];
        let mut params = Vec::new();
        for p in inner.split(',') {
            let p = p.trim();
            if p.is_empty() {
                continue;
            }
            match p.split_once(':') {
                Some((n, t)) => params.push((n.trim().to_string(), t.trim().to_string())),
                None => params.push((p.to_string(), p.to_string())),
            }
        }
        preds.push(QueryPred { name, params });
    }
    Ok(Query { preds })
}

// ---------------------------------------------------------------- expressions

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Dot,
    Plus,
    Or,
}

fn lex(s: &str) -> Result<Vec<Tok>, String> {
    let cs: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '.' {
            out.push(Tok::Dot);
            i += 1;
        } else if c == '+' {
            out.push(Tok::Plus);
            i += 1;
        } else if c == '\'' || c == '"' {
            let mut j = i + 1;
            while j < cs.len() && cs[j] != c {
                j += 1;
            }
            if j >= cs.len() {
                return Err("unterminated string".into());
            }
            out.push(Tok::Str(cs[i + 1..j].iter().collect()));
            i = j + 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut j = i;
            while j < cs.len() && (cs[j].is_alphanumeric() || cs[j] == '_') {
                j += 1;
            }
            let w: String = cs[i..j].iter().collect();
            out.push(if w == "or" { Tok::Or } else { Tok::Ident(w) });
            i = j;
        } else {
            return Err(format!("unsupported character `{c}`"));
        }
    }
    Ok(out)
}

pub fn parse_expr(s: &str) -> Result<Expr, String> {
    let toks = lex(s)?;
    let mut pos = 0;
    let e = parse_or(&toks, &mut pos)?;
    if pos != toks.len() {
        return Err("trailing tokens".into());
    }
    Ok(e)
}

fn parse_or(t: &[Tok], pos: &mut usize) -> Result<Expr, String> {
    let mut e = parse_add(t, pos)?;
    while t.get(*pos) == Some(&Tok::Or) {
        *pos += 1;
        e = Expr::Or(Box::new(e), Box::new(parse_add(t, pos)?));
    }
    Ok(e)
}

fn parse_add(t: &[Tok], pos: &mut usize) -> Result<Expr, String> {
    let mut e = parse_atom(t, pos)?;
    while t.get(*pos) == Some(&Tok::Plus) {
        *pos += 1;
        e = Expr::Add(Box::new(e), Box::new(parse_atom(t, pos)?));
    }
    Ok(e)
}

fn parse_atom(t: &[Tok], pos: &mut usize) -> Result<Expr, String> {
    match t.get(*pos) {
        Some(Tok::Str(s)) => {
            *pos += 1;
            Ok(Expr::Str(s.clone()))
        }
        Some(Tok::Ident(v)) => {
            *pos += 1;
            if t.get(*pos) == Some(&Tok::Dot) {
                if let Some(Tok::Ident(a)) = t.get(*pos + 1) {
                    *pos += 2;
                    return Ok(Expr::Attr(v.clone(), a.clone()));
                }
                return Err("expected an attribute after `.`".into());
            }
            Ok(Expr::Var(v.clone()))
        }
        _ => Err("expected a name or a string".into()),
    }
}

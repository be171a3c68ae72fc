//! thefuzz 0.19.0 with its pure-Python backend (difflib), as the reward uses it:
//! `token_set_ratio` over `full_process` (drop U+0080..U+00FF, `\W` -> space, lower, strip),
//! with `ratio` = `round(100 * SequenceMatcher(None, a, b).ratio())` (autojunk on, Python's
//! half-even rounding). rapidfuzz / python-Levenshtein give other numbers; this follows difflib.

use std::collections::{HashMap, HashSet};

use unicode_categories::UnicodeCategories;

use super::pytext::{py_lower, py_str_repr, py_strip};

/// Python's `\w` (str pattern): letters, digits / numerics, and `_`.
fn py_word_char(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric() || c == '_';
    }
    c.is_letter() || c.is_number_decimal_digit() || c.is_number_letter() || c.is_number_other()
}

/// `utils.full_process(s, force_ascii=True)`.
pub fn full_process(s: &str) -> String {
    let replaced: String = s
        .chars()
        .filter(|&c| !(0x80..=0xff).contains(&(c as u32)))
        .map(|c| if py_word_char(c) { c } else { ' ' })
        .collect();
    py_strip(&py_lower(&replaced)).to_string()
}

/// difflib's `SequenceMatcher(None, a, b)`: the total size of the matching blocks
/// (`get_matching_blocks`, whose order does not change the total). `find_longest_match` keeps
/// difflib's `j2len` rows as dense arrays: row `i` holds, for each `j` in `[blo, bhi)` where
/// `a[i] == b[j]` and `b[j]` is not autojunk-popular, the length of the match ending there —
/// exactly the entries difflib's dict holds, visited in the same (ascending `j`) order.
pub fn matching_chars<T: Copy + Eq + std::hash::Hash>(a: &[T], b: &[T]) -> usize {
    // autojunk: elements of b that occur more than 1% (+1) of len(b) >= 200 are "popular"
    let n = b.len();
    let mut popular: HashSet<T> = HashSet::new();
    if n >= 200 {
        let mut counts: HashMap<T, usize> = HashMap::new();
        for &c in b {
            *counts.entry(c).or_insert(0) += 1;
        }
        let ntest = n / 100 + 1;
        popular = counts.into_iter().filter(|&(_, k)| k > ntest).map(|(c, _)| c).collect();
    }
    let usable: Vec<bool> = b.iter().map(|c| !popular.contains(c)).collect();
    let mut total = 0;
    let mut queue = vec![(0usize, a.len(), 0usize, b.len())];
    let mut prev = vec![0usize; n + 1];
    let mut cur = vec![0usize; n + 1];
    while let Some((alo, ahi, blo, bhi)) = queue.pop() {
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        // prev[j + 1] = j2len[j] of the previous row (0 when absent)
        prev[blo..=bhi].iter_mut().for_each(|x| *x = 0);
        for (i, &ai) in a.iter().enumerate().take(ahi).skip(alo) {
            for j in blo..bhi {
                let k = if b[j] == ai && usable[j] { prev[j] + 1 } else { 0 };
                cur[j + 1] = k;
                if k > bestsize {
                    besti = i + 1 - k;
                    bestj = j + 1 - k;
                    bestsize = k;
                }
            }
            cur[blo] = 0;
            std::mem::swap(&mut prev, &mut cur);
        }
        while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
            besti -= 1;
            bestj -= 1;
            bestsize += 1;
        }
        while besti + bestsize < ahi && bestj + bestsize < bhi && a[besti + bestsize] == b[bestj + bestsize] {
            bestsize += 1;
        }
        if bestsize > 0 {
            total += bestsize;
            if alo < besti && blo < bestj {
                queue.push((alo, besti, blo, bestj));
            }
            if besti + bestsize < ahi && bestj + bestsize < bhi {
                queue.push((besti + bestsize, ahi, bestj + bestsize, bhi));
            }
        }
    }
    total
}

/// difflib's algorithm with its dicts, as written (the plain reference the dense version above
/// is tested against).
pub fn matching_chars_reference(a: &[char], b: &[char]) -> usize {
    let mut b2j: HashMap<char, Vec<usize>> = HashMap::new();
    for (j, &c) in b.iter().enumerate() {
        b2j.entry(c).or_default().push(j);
    }
    let n = b.len();
    if n >= 200 {
        let ntest = n / 100 + 1;
        b2j.retain(|_, v| v.len() <= ntest);
    }
    let mut total = 0;
    let mut queue = vec![(0usize, a.len(), 0usize, b.len())];
    while let Some((alo, ahi, blo, bhi)) = queue.pop() {
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        let mut j2len: HashMap<usize, usize> = HashMap::new();
        for (i, ai) in a.iter().enumerate().take(ahi).skip(alo) {
            let mut newj2len: HashMap<usize, usize> = HashMap::new();
            if let Some(js) = b2j.get(ai) {
                for &j in js {
                    if j < blo {
                        continue;
                    }
                    if j >= bhi {
                        break;
                    }
                    let k = j.checked_sub(1).and_then(|p| j2len.get(&p)).copied().unwrap_or(0) + 1;
                    newj2len.insert(j, k);
                    if k > bestsize {
                        besti = i + 1 - k;
                        bestj = j + 1 - k;
                        bestsize = k;
                    }
                }
            }
            j2len = newj2len;
        }
        while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
            besti -= 1;
            bestj -= 1;
            bestsize += 1;
        }
        while besti + bestsize < ahi && bestj + bestsize < bhi && a[besti + bestsize] == b[bestj + bestsize] {
            bestsize += 1;
        }
        if bestsize > 0 {
            total += bestsize;
            if alo < besti && blo < bestj {
                queue.push((alo, besti, blo, bestj));
            }
            if besti + bestsize < ahi && bestj + bestsize < bhi {
                queue.push((besti + bestsize, ahi, bestj + bestsize, bhi));
            }
        }
    }
    total
}

/// `fuzz.ratio(a, b)` on processed strings (equal -> 100, an empty one -> 0).
pub fn ratio(a: &str, b: &str) -> u32 {
    if a == b {
        return 100;
    }
    if a.is_empty() || b.is_empty() {
        return 0;
    }
    let (m, la, lb) = if a.is_ascii() && b.is_ascii() {
        // one char a byte: the same blocks over the bytes
        (matching_chars(a.as_bytes(), b.as_bytes()), a.len(), b.len())
    } else {
        let a: Vec<char> = a.chars().collect();
        let b: Vec<char> = b.chars().collect();
        (matching_chars(&a, &b), a.len(), b.len())
    };
    ratio_of(m, la, lb)
}

/// `round(100 * 2 m / (la + lb))` as thefuzz rounds it.
fn ratio_of(m: usize, la: usize, lb: usize) -> u32 {
    let r = 2.0 * m as f64 / (la + lb) as f64;
    (100.0 * r).round_ties_even() as u32
}

/// An upper bound of [`matching_chars`] for ASCII strings: the matching blocks pair equal
/// characters once each, so at most the characters the two strings share as multisets.
fn shared_chars_ascii(a: &[u8], b: &[u8]) -> usize {
    let mut counts = [0i32; 128];
    for &c in a {
        counts[c as usize] += 1;
    }
    let mut shared = 0;
    for &c in b {
        if counts[c as usize] > 0 {
            counts[c as usize] -= 1;
            shared += 1;
        }
    }
    shared
}

/// `fuzz.token_set_ratio(s1, s2)` for two strings.
pub fn token_set_ratio(s1: &str, s2: &str) -> u32 {
    token_set_ratio_processed(&full_process(s1), &full_process(s2))
}

/// The three strings `token_set_ratio` compares: the sorted intersection of the two token sets,
/// and it followed by each side's sorted remainder (stripped).
fn token_set_strings(p1: &str, p2: &str) -> (String, String, String) {
    let mut t1: Vec<&str> = p1.split_whitespace().collect();
    let mut t2: Vec<&str> = p2.split_whitespace().collect();
    t1.sort_unstable();
    t1.dedup();
    t2.sort_unstable();
    t2.dedup();
    // the sorted intersection and differences, by a merge
    let (mut inter, mut d12, mut d21) = (Vec::new(), Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < t1.len() || j < t2.len() {
        match (t1.get(i), t2.get(j)) {
            (Some(a), Some(b)) if a == b => {
                inter.push(*a);
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                d12.push(*a);
                i += 1;
            }
            (Some(_), Some(b)) => {
                d21.push(*b);
                j += 1;
            }
            (Some(a), None) => {
                d12.push(*a);
                i += 1;
            }
            (None, Some(b)) => {
                d21.push(*b);
                j += 1;
            }
            (None, None) => unreachable!(),
        }
    }
    let sect = inter.join(" ");
    let c12 = format!("{sect} {}", d12.join(" ")).trim().to_string();
    let c21 = format!("{sect} {}", d21.join(" ")).trim().to_string();
    (sect.trim().to_string(), c12, c21)
}

/// `token_set_ratio` on strings already through [`full_process`].
pub fn token_set_ratio_processed(p1: &str, p2: &str) -> u32 {
    if p1.is_empty() || p2.is_empty() {
        return 0;
    }
    let (sect, c12, c21) = token_set_strings(p1, p2);
    ratio(&sect, &c12).max(ratio(&sect, &c21)).max(ratio(&c12, &c21))
}

/// Whether `ratio(a, b) > threshold`, without matching the characters when the lengths alone
/// bound it (at most `round(200 min(len) / (len a + len b))`).
fn ratio_above(a: &str, b: &str, threshold: u32) -> bool {
    if a == b {
        return 100 > threshold;
    }
    let (la, lb) = (a.chars().count(), b.chars().count());
    if la == 0 || lb == 0 {
        return false;
    }
    if ratio_of(la.min(lb), la, lb) <= threshold {
        return false;
    }
    if a.is_ascii() && b.is_ascii() && ratio_of(shared_chars_ascii(a.as_bytes(), b.as_bytes()), la, lb) <= threshold {
        return false;
    }
    ratio(a, b) > threshold
}

/// `token_set_ratio_processed(p1, p2) > threshold`, computed only as far as needed: first
/// bounded from the token sets' lengths and the characters the two strings share
/// ([`token_set_may_exceed`]), then the three strings made and compared.
pub fn token_set_ratio_above(p1: &str, p2: &str, threshold: u32) -> bool {
    if p1.is_empty() || p2.is_empty() {
        return false;
    }
    if p1.is_ascii() && p2.is_ascii() && !token_set_may_exceed(p1, p2, threshold) {
        return false;
    }
    token_set_ratio_above_exact(p1, p2, threshold)
}

/// [`token_set_ratio_above`] past its bound: the three strings made and compared.
fn token_set_ratio_above_exact(p1: &str, p2: &str, threshold: u32) -> bool {
    let (sect, c12, c21) = token_set_strings(p1, p2);
    ratio_above(&sect, &c12, threshold) || ratio_above(&sect, &c21, threshold) || ratio_above(&c12, &c21, threshold)
}

/// A string already through [`full_process`], prepared for comparing it with many others
/// ([`token_set_ratio_above_prepared`]): its distinct tokens sorted and, when it is ASCII, how
/// many times each character occurs.
pub struct Prepared<'a> {
    text: &'a str,
    tokens: Vec<&'a str>,
    counts: Option<Box<[u32; 128]>>,
}

impl<'a> Prepared<'a> {
    pub fn new(text: &'a str) -> Prepared<'a> {
        let mut tokens: Vec<&str> = text.split_whitespace().collect();
        tokens.sort_unstable();
        tokens.dedup();
        let counts = text.is_ascii().then(|| {
            let mut c = Box::new([0u32; 128]);
            for &b in text.as_bytes() {
                c[b as usize] += 1;
            }
            c
        });
        Prepared { text, tokens, counts }
    }
}

/// [`token_set_ratio_above`] of two prepared strings: the same bound from the tokens and the
/// shared characters (counted per character instead of string against string), without
/// splitting and sorting the strings again for each pair (`token_set_ratio_above` is the
/// reference; a proptest compares them).
pub fn token_set_ratio_above_prepared(p1: &Prepared<'_>, p2: &Prepared<'_>, threshold: u32) -> bool {
    if p1.text.is_empty() || p2.text.is_empty() {
        return false;
    }
    if let (Some(c1), Some(c2)) = (&p1.counts, &p2.counts) {
        let shared = || c1.iter().zip(c2.iter()).map(|(a, b)| (*a).min(*b) as usize).sum();
        if !token_set_bound(&p1.tokens, &p2.tokens, shared, threshold) {
            return false;
        }
    }
    token_set_ratio_above_exact(p1.text, p2.text, threshold)
}

/// Whether `token_set_ratio_processed(p1, p2)` (ASCII strings) can be above `threshold`, without
/// making its strings. With `sect` the sorted common tokens and `c12` / `c21` it followed by each
/// side's other tokens: `ratio(sect, c1x)` matches at most `len(sect)` characters; `ratio(c12,
/// c21)` at most the characters `p1` and `p2` share as multisets (`c12`'s characters are some of
/// `p1`'s: its tokens once each, one space between two), and at most the shorter length. Equal
/// strings give 100. False only when no ratio can be above.
fn token_set_may_exceed(p1: &str, p2: &str, threshold: u32) -> bool {
    let mut t1: Vec<&str> = p1.split_whitespace().collect();
    let mut t2: Vec<&str> = p2.split_whitespace().collect();
    if t1.is_empty() || t2.is_empty() {
        return true;
    }
    t1.sort_unstable();
    t1.dedup();
    t2.sort_unstable();
    t2.dedup();
    token_set_bound(&t1, &t2, || shared_chars_ascii(p1.as_bytes(), p2.as_bytes()), threshold)
}

/// [`token_set_may_exceed`] from the two strings' distinct tokens sorted (not empty) and the
/// characters they share (`shared`, asked for only when the lengths do not decide). True when
/// a side has no token.
fn token_set_bound(t1: &[&str], t2: &[&str], shared: impl FnOnce() -> usize, threshold: u32) -> bool {
    if t1.is_empty() || t2.is_empty() {
        return true;
    }
    // common tokens and each side's others: how many and their lengths
    let (mut ni, mut li, mut n1, mut l1, mut n2, mut l2) = (0usize, 0usize, 0usize, 0usize, 0usize, 0usize);
    let (mut i, mut j) = (0, 0);
    while i < t1.len() || j < t2.len() {
        match (t1.get(i), t2.get(j)) {
            (Some(a), Some(b)) if a == b => {
                ni += 1;
                li += a.len();
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                n1 += 1;
                l1 += a.len();
                i += 1;
            }
            (Some(_), Some(b)) | (None, Some(b)) => {
                n2 += 1;
                l2 += b.len();
                j += 1;
            }
            (Some(a), None) => {
                n1 += 1;
                l1 += a.len();
                i += 1;
            }
            (None, None) => unreachable!(),
        }
    }
    let joined = |n: usize, l: usize| if n == 0 { 0 } else { l + n - 1 };
    let sect = joined(ni, li);
    let c12 = sect + joined(n1, l1) + usize::from(ni > 0 && n1 > 0);
    let c21 = sect + joined(n2, l2) + usize::from(ni > 0 && n2 > 0);
    // ratio(sect, c12) and ratio(sect, c21)
    for (n, c) in [(n1, c12), (n2, c21)] {
        if n == 0 || (sect > 0 && ratio_of(sect, sect, c) > threshold) {
            return true;
        }
    }
    // ratio(c12, c21)
    if n1 == 0 && n2 == 0 {
        return true;
    }
    let m = shared().min(c12).min(c21);
    ratio_of(m, c12, c21) > threshold
}

/// A value thefuzz is given: a string, or a `(name, value)` tuple (synthetic goal options),
/// which thefuzz turns into `str(tuple)`.
#[derive(Clone, Debug, PartialEq)]
pub enum FuzzArg<'a> {
    Str(&'a str),
    Pair(&'a str, &'a str),
}

impl FuzzArg<'_> {
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            FuzzArg::Str(s) => std::borrow::Cow::Borrowed(s),
            FuzzArg::Pair(a, b) => std::borrow::Cow::Owned(format!("({}, {})", py_str_repr(a), py_str_repr(b))),
        }
    }
}

/// `token_set_ratio` on strings or tuples.
pub fn token_set_ratio_args(a: &FuzzArg<'_>, b: &FuzzArg<'_>) -> u32 {
    token_set_ratio(&a.text(), &b.text())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// thefuzz's `token_set_ratio` as written (sets, sorted joins): the reference of the merge.
    fn token_set_ratio_reference(p1: &str, p2: &str) -> u32 {
        if p1.is_empty() || p2.is_empty() {
            return 0;
        }
        let t1: BTreeSet<&str> = p1.split_whitespace().collect();
        let t2: BTreeSet<&str> = p2.split_whitespace().collect();
        let join = |s: Vec<&str>| s.join(" ");
        let sect = join(t1.intersection(&t2).copied().collect());
        let s12 = join(t1.difference(&t2).copied().collect());
        let s21 = join(t2.difference(&t1).copied().collect());
        let c12 = format!("{sect} {s12}");
        let c21 = format!("{sect} {s21}");
        let (sect, c12, c21) = (sect.trim(), c12.trim(), c21.trim());
        ratio(sect, c12).max(ratio(sect, c21)).max(ratio(c12, c21))
    }

    proptest! {
        /// The merged token sets give thefuzz's numbers, and the threshold test its comparison.
        #[test]
        fn token_set_ratio_equals_the_reference(a in "[abc é]{0,24}", b in "[abc é]{0,24}", t in 0u32..101) {
            let (a, b) = (full_process(&a), full_process(&b));
            let r = token_set_ratio_reference(&a, &b);
            prop_assert_eq!(token_set_ratio_processed(&a, &b), r);
            prop_assert_eq!(token_set_ratio_above(&a, &b, t), r > t);
            prop_assert_eq!(token_set_ratio_above(&a, &b, 85), r > 85);
        }
    }

    proptest! {
        /// The dense find_longest_match equals difflib's dict version, autojunk included.
        #[test]
        fn dense_equals_reference(a in "[abc ]{0,40}", b in "[abc ]{0,40}", long in 0usize..3) {
            let a: Vec<char> = a.chars().collect();
            let mut b: Vec<char> = b.chars().collect();
            if long > 0 {
                // >= 200 elements: popular characters are junked
                b = b.iter().cycle().take(if b.is_empty() { 0 } else { 200 + 37 * long }).copied().collect();
            }
            prop_assert_eq!(matching_chars(&a, &b), matching_chars_reference(&a, &b));
            prop_assert_eq!(matching_chars(&b, &a), matching_chars_reference(&b, &a));
        }
    }

    proptest! {
        /// The bound from lengths and shared characters never refuses a pair whose ratio is
        /// above the threshold (more letters than the test above: most pairs are bounded off).
        #[test]
        fn token_set_bound_never_refuses_a_match(a in "[a-h ]{0,30}", b in "[a-h ]{0,30}", t in 0u32..101) {
            let (a, b) = (full_process(&a), full_process(&b));
            let r = token_set_ratio_reference(&a, &b);
            if r > t && !a.is_empty() && !b.is_empty() {
                prop_assert!(token_set_may_exceed(&a, &b, t));
            }
            prop_assert_eq!(token_set_ratio_above(&a, &b, t), r > t);
        }
    }

    proptest! {
        /// Prepared strings give the threshold test of the strings themselves (ASCII or not,
        /// repeated tokens, empty strings).
        #[test]
        fn prepared_equals_the_plain_threshold_test(a in "[a-f ]{0,30}", b in "[a-f é]{0,30}", t in 0u32..101) {
            let (a, b) = (full_process(&a), full_process(&b));
            let (pa, pb) = (Prepared::new(&a), Prepared::new(&b));
            prop_assert_eq!(token_set_ratio_above_prepared(&pa, &pb, t), token_set_ratio_above(&a, &b, t));
            prop_assert_eq!(token_set_ratio_above_prepared(&pb, &pa, t), token_set_ratio_above(&b, &a, t));
            prop_assert_eq!(token_set_ratio_above_prepared(&pa, &pb, 85), token_set_ratio_reference(&a, &b) > 85);
        }
    }

    proptest! {
        /// The shared characters bound the matching blocks; the bytes of ASCII strings give the
        /// blocks of their chars.
        #[test]
        fn shared_chars_bound_the_matching_blocks(a in "[abc d]{0,60}", b in "[abc d]{0,60}") {
            let (ca, cb): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
            let m = matching_chars(&ca, &cb);
            prop_assert_eq!(matching_chars(a.as_bytes(), b.as_bytes()), m);
            prop_assert!(m <= shared_chars_ascii(a.as_bytes(), b.as_bytes()));
        }
    }

    // python3 -c 'from difflib import SequenceMatcher as S; print(S(None,"abxcd","abcd").ratio())'
    #[test]
    fn difflib_examples() {
        let r = |a: &str, b: &str| {
            let a: Vec<char> = a.chars().collect();
            let b: Vec<char> = b.chars().collect();
            matching_chars(&a, &b)
        };
        assert_eq!(r("abxcd", "abcd"), 4);
        assert_eq!(r("private thread", "thread private"), 7);
        assert_eq!(r("qabxcd", "abycdf"), 4);
        assert_eq!(ratio("grey", "black"), 0);
        assert_eq!(token_set_ratio("machine washable", "living room"), 22);
        assert_eq!(token_set_ratio("medium", "('size', 'medium')"), 100);
    }
}

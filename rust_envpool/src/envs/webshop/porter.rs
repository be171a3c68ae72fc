//! Lucene's `PorterStemmer` (the classic Porter algorithm of Martin Porter's reference
//! implementation, as `PorterStemFilter` runs it): works on UTF-16 code units, any non-ASCII
//! unit is a consonant, words of fewer than three units are left alone.

struct Stemmer {
    b: Vec<u16>,
    k: usize,
    j: usize,
    k0: usize,
}

const fn u(c: char) -> u16 {
    c as u16
}

impl Stemmer {
    fn cons(&self, i: usize) -> bool {
        match self.b[i] {
            x if x == u('a') || x == u('e') || x == u('i') || x == u('o') || x == u('u') => false,
            x if x == u('y') => {
                if i == self.k0 {
                    true
                } else {
                    !self.cons(i - 1)
                }
            }
            _ => true,
        }
    }

    /// Number of consonant sequences between k0 and j.
    fn m(&self) -> usize {
        let mut n = 0;
        let mut i = self.k0;
        let j = self.j as isize;
        loop {
            if i as isize > j {
                return n;
            }
            if !self.cons(i) {
                break;
            }
            i += 1;
        }
        i += 1;
        loop {
            loop {
                if i as isize > j {
                    return n;
                }
                if self.cons(i) {
                    break;
                }
                i += 1;
            }
            i += 1;
            n += 1;
            loop {
                if i as isize > j {
                    return n;
                }
                if !self.cons(i) {
                    break;
                }
                i += 1;
            }
            i += 1;
        }
    }

    fn vowelinstem(&self) -> bool {
        (self.k0..=self.j).any(|i| !self.cons(i))
    }

    fn doublec(&self, j: usize) -> bool {
        if j < self.k0 + 1 {
            return false;
        }
        if self.b[j] != self.b[j - 1] {
            return false;
        }
        self.cons(j)
    }

    fn cvc(&self, i: usize) -> bool {
        if i < self.k0 + 2 || !self.cons(i) || self.cons(i - 1) || !self.cons(i - 2) {
            return false;
        }
        let ch = self.b[i];
        !(ch == u('w') || ch == u('x') || ch == u('y'))
    }

    fn ends(&mut self, s: &str) -> bool {
        let l = s.len();
        if l > self.k + 1 || self.k + 1 - l < self.k0 {
            return false;
        }
        let o = self.k + 1 - l;
        if !s.bytes().enumerate().all(|(i, c)| self.b[o + i] == c as u16) {
            return false;
        }
        // j = k - l (may be k0 - 1 when the suffix is the whole word; kept as a wrapping index
        // that m()/vowelinstem() treat as "before k0")
        self.j = (self.k as isize - l as isize) as usize;
        true
    }

    fn setto(&mut self, s: &str) {
        let o = self.j.wrapping_add(1);
        let l = s.len();
        if self.b.len() < o + l {
            self.b.resize(o + l, 0);
        }
        for (i, c) in s.bytes().enumerate() {
            self.b[o + i] = c as u16;
        }
        self.k = self.j.wrapping_add(l);
    }

    fn r(&mut self, s: &str) {
        if self.m_safe() > 0 {
            self.setto(s);
        }
    }

    /// m() with j possibly "k0 - 1" (wrapped): no consonant sequence then.
    fn m_safe(&self) -> usize {
        if (self.j as isize) < self.k0 as isize {
            0
        } else {
            self.m()
        }
    }

    fn vowelinstem_safe(&self) -> bool {
        if (self.j as isize) < self.k0 as isize {
            false
        } else {
            self.vowelinstem()
        }
    }

    fn step1(&mut self) {
        if self.b[self.k] == u('s') {
            if self.ends("sses") {
                self.k -= 2;
            } else if self.ends("ies") {
                self.setto("i");
            } else if self.b[self.k - 1] != u('s') {
                self.k -= 1;
            }
        }
        if self.ends("eed") {
            if self.m_safe() > 0 {
                self.k -= 1;
            }
        } else if (self.ends("ed") || self.ends("ing")) && self.vowelinstem_safe() {
            self.k = self.j;
            if self.ends("at") {
                self.setto("ate");
            } else if self.ends("bl") {
                self.setto("ble");
            } else if self.ends("iz") {
                self.setto("ize");
            } else if self.doublec(self.k) {
                let ch = self.b[self.k];
                self.k -= 1;
                if ch == u('l') || ch == u('s') || ch == u('z') {
                    self.k += 1;
                }
            } else if self.m_safe() == 1 && self.cvc(self.k) {
                self.setto("e");
            }
        }
    }

    fn step2(&mut self) {
        if self.ends("y") && self.vowelinstem_safe() {
            self.b[self.k] = u('i');
        }
    }

    fn step3(&mut self) {
        if self.k == self.k0 {
            return;
        }
        let c = self.b[self.k - 1];
        let table: &[(&str, &str)] = match c as u8 as char {
            _ if c > 0x7f => &[],
            'a' => &[("ational", "ate"), ("tional", "tion")],
            'c' => &[("enci", "ence"), ("anci", "ance")],
            'e' => &[("izer", "ize")],
            'l' => &[
                ("bli", "ble"),
                ("alli", "al"),
                ("entli", "ent"),
                ("eli", "e"),
                ("ousli", "ous"),
            ],
            'o' => &[("ization", "ize"), ("ation", "ate"), ("ator", "ate")],
            's' => &[
                ("alism", "al"),
                ("iveness", "ive"),
                ("fulness", "ful"),
                ("ousness", "ous"),
            ],
            't' => &[("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")],
            'g' => &[("logi", "log")],
            _ => &[],
        };
        for (suf, rep) in table {
            if self.ends(suf) {
                self.r(rep);
                break;
            }
        }
    }

    fn step4(&mut self) {
        let c = self.b[self.k];
        let table: &[(&str, &str)] = match c as u8 as char {
            _ if c > 0x7f => &[],
            'e' => &[("icate", "ic"), ("ative", ""), ("alize", "al")],
            'i' => &[("iciti", "ic")],
            'l' => &[("ical", "ic"), ("ful", "")],
            's' => &[("ness", "")],
            _ => &[],
        };
        for (suf, rep) in table {
            if self.ends(suf) {
                self.r(rep);
                break;
            }
        }
    }

    fn step5(&mut self) {
        if self.k == self.k0 {
            return;
        }
        let c = self.b[self.k - 1];
        let hit = match c as u8 as char {
            _ if c > 0x7f => false,
            'a' => self.ends("al"),
            'c' => self.ends("ance") || self.ends("ence"),
            'e' => self.ends("er"),
            'i' => self.ends("ic"),
            'l' => self.ends("able") || self.ends("ible"),
            'n' => self.ends("ant") || self.ends("ement") || self.ends("ment") || self.ends("ent"),
            'o' => {
                (self.ends("ion")
                    && (self.j as isize) >= self.k0 as isize
                    && (self.b[self.j] == u('s') || self.b[self.j] == u('t')))
                    || self.ends("ou")
            }
            's' => self.ends("ism"),
            't' => self.ends("ate") || self.ends("iti"),
            'u' => self.ends("ous"),
            'v' => self.ends("ive"),
            'z' => self.ends("ize"),
            _ => false,
        };
        if hit && self.m_safe() > 1 {
            self.k = self.j;
        }
    }

    fn step6(&mut self) {
        self.j = self.k;
        if self.b[self.k] == u('e') {
            let a = self.m();
            if a > 1 || (a == 1 && !self.cvc(self.k - 1)) {
                self.k -= 1;
            }
        }
        if self.b[self.k] == u('l') && self.doublec(self.k) && self.m() > 1 {
            self.k -= 1;
        }
    }
}

/// Stems one (lower-cased) token as Lucene's `PorterStemFilter` does.
pub fn stem(word: &str) -> String {
    let b: Vec<u16> = word.encode_utf16().collect();
    if b.len() < 3 {
        return word.to_string();
    }
    let mut s = Stemmer {
        k: b.len() - 1,
        b,
        j: 0,
        k0: 0,
    };
    s.step1();
    s.step2();
    s.step3();
    s.step4();
    s.step5();
    s.step6();
    String::from_utf16_lossy(&s.b[..=s.k])
}

#[cfg(test)]
mod tests {
    use super::stem;

    #[test]
    fn classic_porter_examples() {
        // Lucene's PorterStemmer / the reference implementation (y -> i, "bli" -> "ble", "logi" -> "log")
        let cases = [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "ti"),
            ("caress", "caress"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("bled", "bled"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("troubled", "troubl"),
            ("sized", "size"),
            ("hopping", "hop"),
            ("tanned", "tan"),
            ("falling", "fall"),
            ("hissing", "hiss"),
            ("fizzed", "fizz"),
            ("failing", "fail"),
            ("filing", "file"),
            ("happy", "happi"),
            ("sky", "sky"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("rational", "ration"),
            ("valenci", "valenc"),
            ("digitizer", "digit"),
            ("conformabli", "conform"),
            ("radicalli", "radic"),
            ("differentli", "differ"),
            ("vileli", "vile"),
            ("analogousli", "analog"),
            ("vietnamization", "vietnam"),
            ("predication", "predic"),
            ("operator", "oper"),
            ("feudalism", "feudal"),
            ("decisiveness", "decis"),
            ("hopefulness", "hope"),
            ("callousness", "callous"),
            ("formaliti", "formal"),
            ("sensitiviti", "sensit"),
            ("sensibiliti", "sensibl"),
            ("triplicate", "triplic"),
            ("formative", "form"),
            ("formalize", "formal"),
            ("electriciti", "electr"),
            ("electrical", "electr"),
            ("hopeful", "hope"),
            ("goodness", "good"),
            ("revival", "reviv"),
            ("allowance", "allow"),
            ("inference", "infer"),
            ("airliner", "airlin"),
            ("gyroscopic", "gyroscop"),
            ("adjustable", "adjust"),
            ("defensible", "defens"),
            ("irritant", "irrit"),
            ("replacement", "replac"),
            ("adjustment", "adjust"),
            ("dependent", "depend"),
            ("adoption", "adopt"),
            ("homologou", "homolog"),
            ("communism", "commun"),
            ("activate", "activ"),
            ("angulariti", "angular"),
            ("homologous", "homolog"),
            ("effective", "effect"),
            ("bowdlerize", "bowdler"),
            ("probate", "probat"),
            ("rate", "rate"),
            ("cease", "ceas"),
            ("controll", "control"),
            ("roll", "roll"),
            ("tables", "tabl"),
            ("days", "dai"),
            ("may", "mai"),
            ("natural", "natur"),
            ("lights", "light"),
            ("reclaimed", "reclaim"),
            ("antiquing", "antiqu"),
            ("glaze", "glaze"),
            ("genessis", "genessi"),
            ("beige", "beig"),
            ("is", "is"),
            ("ed", "ed"),
            ("eed", "eed"),
            ("ing", "ing"),
            ("ying", "ying"),
            ("yes", "ye"),
        ];
        for (w, want) in cases {
            assert_eq!(stem(w), want, "{w}");
        }
    }
}

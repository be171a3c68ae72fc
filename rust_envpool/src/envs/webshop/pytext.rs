//! Python's text functions where WebShop's output depends on their exact behaviour: `str.strip()`
//! (Python's whitespace set), `repr(float)`, `repr(str)`, `json.dumps` (with `ensure_ascii`) and
//! Flask's `tojson` (sorted keys, HTML-safe escapes).

/// Python's `str.isspace()` for one character: Unicode White_Space plus the ASCII information
/// separators U+001C..U+001F, which CPython also counts as whitespace.
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `s.strip()`.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// `s.lower()` (full Unicode lower-casing, final sigma included, as CPython does).
pub fn py_lower(s: &str) -> String {
    if s.is_ascii() {
        s.to_ascii_lowercase()
    } else {
        s.to_lowercase()
    }
}

/// `repr(x)` / `str(x)` of a Python float: the shortest round-trip digits, fixed notation for
/// decimal exponents in [-4, 16), scientific (`1e+16`, `5e-05`) otherwise; `.0` on integers.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let e = format!("{:e}", x); // shortest round-trip digits: "-1.2345e-5"
    let (mant, exp) = e.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("exponent");
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else {
            let point = exp as usize + 1;
            if digits.len() <= point {
                out.push_str(&digits);
                for _ in digits.len()..point {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exp.abs()));
    }
    out
}

/// Whether CPython's `str.isprintable()` holds for `c`, closely enough for `repr` of option
/// values: control characters, the C1 block, no-break space, soft hyphen, line/paragraph
/// separators and other format/separator characters are not printable.
fn py_printable(c: char) -> bool {
    let u = c as u32;
    if c == ' ' {
        return true;
    }
    if u < 0x20 || (0x7f..=0xa0).contains(&u) || u == 0xad {
        return false;
    }
    if c.is_whitespace() {
        return false; // Zs/Zl/Zp other than ' '
    }
    !matches!(u, 0x200b..=0x200f | 0x2028..=0x202e | 0x2060..=0x2064 | 0xfeff | 0xfff9..=0xfffb)
        && !(0xe000..=0xf8ff).contains(&u)
}

/// `repr(s)` of a Python str.
pub fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if py_printable(c) => out.push(c),
            c => {
                let u = c as u32;
                if u < 0x100 {
                    out.push_str(&format!("\\x{u:02x}"));
                } else if u < 0x10000 {
                    out.push_str(&format!("\\u{u:04x}"));
                } else {
                    out.push_str(&format!("\\U{u:08x}"));
                }
            }
        }
    }
    out.push(quote);
    out
}

/// `repr(d)` of a dict of str to str, in insertion order.
pub fn py_dict_repr(items: &[(String, String)]) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|(k, v)| format!("{}: {}", py_str_repr(k), py_str_repr(v)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// A JSON string literal as Python's `json.dumps` writes it with `ensure_ascii=True`.
pub fn json_str_ascii(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `json.dumps(d)` of a dict of str to str (insertion order, `ensure_ascii`).
pub fn json_dumps_dict(items: &[(String, String)]) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        json_str_ascii(k, &mut out);
        out.push_str(": ");
        json_str_ascii(v, &mut out);
    }
    out.push('}');
    out
}

/// Flask 2.1's `{{ d | tojson }}`: sorted keys, ASCII only, and `< > & '` as `\u003c \u003e
/// \u0026 \u0027`.
pub fn flask_tojson_dict(items: &[(String, String)]) -> String {
    let mut sorted: Vec<(String, String)> = items.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    json_dumps_dict(&sorted)
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\'', "\\u0027")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // python3 -c 'print([repr(x) for x in (877.8, 100.0, 0.1, 1e16, 5e-05, 0.0001, 123456789012345.6, 0.6666666666666666, 1.0, 26.74537481220038)])'
        let cases = [
            (877.8, "877.8"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (5e-05, "5e-05"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (2.0 / 3.0, "0.6666666666666666"),
            (1.0, "1.0"),
            (26.74537481220038, "26.74537481220038"),
            (1e22, "1e+22"),
            (1.5e-7, "1.5e-07"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn str_repr_and_json() {
        assert_eq!(py_str_repr("28\" x 28\""), "'28\" x 28\"'");
        assert_eq!(py_str_repr("men's"), "\"men's\"");
        assert_eq!(py_str_repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_str_repr("a\nb\u{a0}é"), "'a\\nb\\xa0é'");
        let d = vec![
            ("size".to_string(), "x-large".to_string()),
            ("color".into(), "café & <b>'".into()),
        ];
        assert_eq!(
            json_dumps_dict(&d),
            r#"{"size": "x-large", "color": "caf\u00e9 & <b>'"}"#
        );
        assert_eq!(
            flask_tojson_dict(&d),
            r#"{"color": "caf\u00e9 \u0026 \u003cb\u003e\u0027", "size": "x-large"}"#
        );
        assert_eq!(py_strip("\u{1f} a \u{a0}"), "a");
    }
}

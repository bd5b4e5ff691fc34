//! Rust source → tokens, enough to find paths: identifiers, `::` and punctuation with
//! their line; comments, strings, character literals, lifetimes and numbers dropped (a
//! `crate::` inside them names nothing).

/// One token of interest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
}

/// A token and the 1-based line it starts on.
#[derive(Debug, Clone)]
pub(super) struct Token {
    pub tok: Tok,
    pub line: u32,
}

/// The tokens of `src`.
pub(super) fn tokens(src: &str) -> Vec<Token> {
    let mut lx = Lexer {
        s: src.as_bytes(),
        i: 0,
        line: 1,
        out: Vec::new(),
    };
    lx.run();
    lx.out
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
    line: u32,
    out: Vec<Token>,
}

impl Lexer<'_> {
    fn at(&self, k: usize) -> u8 {
        self.s.get(self.i + k).copied().unwrap_or(0)
    }

    /// Moves past `n` bytes, counting lines.
    fn bump(&mut self, n: usize) {
        for _ in 0..n {
            if self.i < self.s.len() {
                if self.s[self.i] == b'\n' {
                    self.line += 1;
                }
                self.i += 1;
            }
        }
    }

    fn push(&mut self, tok: Tok, line: u32) {
        self.out.push(Token { tok, line });
    }

    fn run(&mut self) {
        while self.i < self.s.len() {
            let c = self.at(0);
            match c {
                b'/' if self.at(1) == b'/' => self.line_comment(),
                b'/' if self.at(1) == b'*' => self.block_comment(),
                b'"' => self.string(1, None),
                b'\'' => self.quote(),
                b'0'..=b'9' => self.number(),
                c if c == b'_' || c.is_ascii_alphabetic() || c >= 0x80 => self.word(),
                b':' if self.at(1) == b':' => {
                    self.push(Tok::PathSep, self.line);
                    self.bump(2);
                }
                c if c.is_ascii_whitespace() => self.bump(1),
                c => {
                    self.push(Tok::Punct(c as char), self.line);
                    self.bump(1);
                }
            }
        }
    }

    fn line_comment(&mut self) {
        while self.i < self.s.len() && self.at(0) != b'\n' {
            self.bump(1);
        }
    }

    /// Block comments nest in Rust.
    fn block_comment(&mut self) {
        let mut depth = 0usize;
        while self.i < self.s.len() {
            if self.at(0) == b'/' && self.at(1) == b'*' {
                depth += 1;
                self.bump(2);
            } else if self.at(0) == b'*' && self.at(1) == b'/' {
                depth -= 1;
                self.bump(2);
                if depth == 0 {
                    return;
                }
            } else {
                self.bump(1);
            }
        }
    }

    /// A string whose opening quote is `skip` bytes on; `hashes` > 0 or a raw prefix
    /// means a raw string (no escapes, ends at `"` and that many `#`).
    fn string(&mut self, skip: usize, hashes: Option<usize>) {
        self.bump(skip);
        while self.i < self.s.len() {
            match (self.at(0), hashes) {
                (b'\\', None) => self.bump(2),
                (b'"', None) => {
                    self.bump(1);
                    return;
                }
                (b'"', Some(h)) if (1..=h).all(|k| self.at(k) == b'#') => {
                    self.bump(1 + h);
                    return;
                }
                _ => self.bump(1),
            }
        }
    }

    /// A character literal (`'a'`, `'\n'`, `'\u{1F600}'`) or a lifetime (`'a`).
    fn quote(&mut self) {
        if self.at(1) == b'\\' {
            self.bump(2);
            while self.i < self.s.len() && self.at(0) != b'\'' {
                self.bump(1);
            }
            self.bump(1);
            return;
        }
        // One character (possibly several UTF-8 bytes) then a quote: a char literal.
        let len = utf8_len(self.at(1));
        if self.at(1 + len) == b'\'' {
            self.bump(2 + len);
            return;
        }
        self.bump(1);
        while is_ident_byte(self.at(0)) {
            self.bump(1);
        }
    }

    fn number(&mut self) {
        while is_ident_byte(self.at(0)) || (self.at(0) == b'.' && self.at(1).is_ascii_digit()) {
            self.bump(1);
        }
    }

    /// An identifier or keyword; a prefix `r`, `b`, `br`, `c`, `cr` before a quote makes
    /// a string, `r#` a raw identifier.
    fn word(&mut self) {
        let (c0, c1) = (self.at(0), self.at(1));
        let raw_start = match (c0, c1) {
            (b'r', b'"' | b'#') => Some(1),
            (b'b' | b'c', b'r') if matches!(self.at(2), b'"' | b'#') => Some(2),
            _ => None,
        };
        if let Some(p) = raw_start {
            let mut h = 0;
            while self.at(p + h) == b'#' {
                h += 1;
            }
            if self.at(p + h) == b'"' {
                return self.string(p + h + 1, Some(h));
            }
            if p == 1 && h == 1 {
                self.bump(2); // raw identifier r#name
            }
        } else if matches!(c0, b'b' | b'c') && c1 == b'"' {
            return self.string(2, None);
        } else if c0 == b'b' && c1 == b'\'' {
            self.bump(1);
            return self.quote();
        }
        let (start, line) = (self.i, self.line);
        while is_ident_byte(self.at(0)) {
            self.bump(1);
        }
        let w = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.push(Tok::Ident(w), line);
    }
}

fn is_ident_byte(c: u8) -> bool {
    c == b'_' || c.is_ascii_alphanumeric() || c >= 0x80
}

fn utf8_len(c: u8) -> usize {
    match c {
        0xf0..=0xff => 4,
        0xe0..=0xef => 3,
        0xc0..=0xdf => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idents(src: &str) -> Vec<String> {
        tokens(src)
            .into_iter()
            .filter_map(|t| match t.tok {
                Tok::Ident(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn comments_strings_and_chars_name_nothing() {
        let src = r####"
            // crate::a
            /* crate::b /* nested crate::c */ still */
            let s1 = "crate::d \" crate::e";
            let s2 = r#"crate::f " crate::g"#;
            let s3 = br##"crate::h"##;
            let c1 = '"'; let c2 = '\''; let l1: &'static str = x;
            crate::z
        "####;
        let ids = idents(src);
        assert!(
            !ids.iter()
                .any(|s| ["a", "b", "c", "d", "e", "f", "g", "h"].contains(&s.as_str()))
        );
        assert_eq!(ids.last().map(String::as_str), Some("z"));
        assert!(!ids.contains(&"static".to_string()));
    }

    #[test]
    fn lines_count_through_comments_and_strings() {
        let t = tokens("/* a\n b */ \"x\ny\"\nfoo");
        assert_eq!(t[0].line, 4);
    }

    #[test]
    fn raw_identifier() {
        assert_eq!(idents("r#type::x"), ["type", "x"]);
    }
}

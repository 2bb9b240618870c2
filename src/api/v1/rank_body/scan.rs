//! The fast path of `/v1` rank decoding: a byte scanner for bodies in the shape clients write (keys without
//! escapes, ids as plain non-negative integers, each key once; candidates in the row form or the columnar form),
//! about three times faster than going through serde's visitors on a 100-candidate body (`cargo bench --bench
//! rank_decode`).
//!
//! It takes a subset of what the serde decoder of [`super`] takes and, for every body it takes, leaves the
//! [`Decoder`] exactly as that decoder would: the same rows, ids, candidate ids, dense values (parsed by
//! `serde_json` itself, so the same floats) and `top_k`. Anything else — an escape in a key, a negative or
//! fractional id, an unknown or repeated key, an id a table refuses, malformed JSON — makes it give up with
//! `None`, and the body is decoded again by the serde decoder, which names the problem. So there is one source of
//! errors, and the fuzz target `fuzz_rank_decoder_answers_every_body_and_agrees_with_the_reference` checks both
//! paths against each other on arbitrary bodies.

use super::Decoder;
use super::columnar::Columns;
use recserve_core::ranking::RankContract;

/// Scans `body` into `d`, or gives up (`None`) on anything outside the fast path's subset.
pub(super) fn scan(d: &mut Decoder<'_>, body: &[u8]) -> Option<()> {
    // Candidate features (rare, and per candidate) are the serde decoder's alone.
    if d.contract.candidate_features > 0 {
        return None;
    }
    let mut s = Scanner { body, at: 0 };
    s.object(|s, key| match key {
        b"user" if !d.user_read => {
            d.user_read = true;
            s.user(d)
        }
        b"candidates" if d.candidate_ids.is_none() => s.candidates(d),
        b"top_k" if d.top_k.is_none() => {
            let k = if s.null() {
                None
            } else {
                Some(usize::try_from(s.id()?).ok().filter(|&k| k > 0)?)
            };
            d.top_k = Some(k);
            Some(())
        }
        _ => None,
    })?;
    s.skip_ws();
    (s.at == body.len()).then_some(())
}

struct Scanner<'b> {
    body: &'b [u8],
    at: usize,
}

impl<'b> Scanner<'b> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    /// Skips JSON whitespace.
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Skips whitespace, then `byte`, or gives up.
    fn eat(&mut self, byte: u8) -> Option<()> {
        self.skip_ws();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Skips whitespace; steps past the next byte and says so if it is `byte`.
    fn next_is(&mut self, byte: u8) -> bool {
        self.eat(byte).is_some()
    }

    /// `null`, stepped past if it comes next.
    fn null(&mut self) -> bool {
        self.skip_ws();
        let found = self.body[self.at..].starts_with(b"null");
        if found {
            self.at += 4;
        }
        found
    }

    /// A string without escapes or control characters.
    fn string(&mut self) -> Option<&'b [u8]> {
        self.eat(b'"')?;
        let rest = &self.body[self.at..];
        let len = rest
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        if rest[len] != b'"' {
            return None;
        }
        self.at += len + 1;
        Some(&rest[..len])
    }

    /// An object key without escapes or control characters, and the colon after it.
    fn key(&mut self) -> Option<&'b [u8]> {
        let key = self.string()?;
        self.eat(b':')?;
        Some(key)
    }

    /// A JSON integer without sign, fraction or exponent of at most 18 digits (it fits an `i64`; longer ones are
    /// left to the serde decoder).
    fn id(&mut self) -> Option<i64> {
        self.skip_ws();
        let start = self.at;
        let mut value: i64 = 0;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            if self.at - start == 18 {
                return None;
            }
            value = value * 10 + i64::from(digit - b'0');
            self.at += 1;
        }
        let digits = self.at - start;
        // JSON has no leading zeros; a fraction or exponent makes it a float, which the serde decoder refuses.
        if digits == 0 || (digits > 1 && self.body[start] == b'0') {
            return None;
        }
        match self.peek() {
            Some(b'.' | b'e' | b'E') => None,
            _ => Some(value),
        }
    }

    /// An object whose members `member` reads (it is at the value, past the colon); gives up on an empty key
    /// list with a trailing comma, or anything but `,` or `}` after a value.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'b [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.next_is(b'}') {
            return Some(());
        }
        loop {
            let key = self.key()?;
            member(self, key)?;
            if !self.next_is(b',') {
                return self.eat(b'}');
            }
        }
    }

    /// `user`: `{"fields": {...}, "dense": [...]}`.
    fn user(&mut self, d: &mut Decoder<'_>) -> Option<()> {
        self.object(|s, key| match key {
            b"fields" if !d.user_fields_read => {
                s.fields(d, None)?;
                d.user_fields_read = true;
                Some(())
            }
            b"dense" if d.dense.is_none() => {
                d.dense = Some(s.dense()?);
                Some(())
            }
            _ => None,
        })
    }

    /// `user.dense`: an array of numbers only, handed whole to `serde_json` so that each value is the float the
    /// serde decoder reads; every one finite.
    fn dense(&mut self) -> Option<Vec<f32>> {
        self.skip_ws();
        let start = self.at;
        let rest = &self.body[start..];
        if rest.first() != Some(&b'[') {
            return None;
        }
        let len = 1 + rest[1..].iter().position(|&b| {
            !matches!(
                b,
                b'0'..=b'9'
                    | b'-'
                    | b'+'
                    | b'.'
                    | b'e'
                    | b'E'
                    | b','
                    | b' '
                    | b'\t'
                    | b'\n'
                    | b'\r'
            )
        })?;
        if rest[len] != b']' {
            return None;
        }
        let values: Vec<f32> = serde_json::from_slice(&rest[..=len]).ok()?;
        if values
            .iter()
            .any(|&v| RankContract::check_dense(v).is_err())
        {
            return None;
        }
        self.at += len + 1;
        Some(values)
    }

    /// `candidates`: at most [`RankContract::max_rows`] of them (more: the serde decoder says how many), or the
    /// columnar form.
    fn candidates(&mut self, d: &mut Decoder<'_>) -> Option<()> {
        self.skip_ws();
        if self.peek() == Some(b'{') {
            return self.columns(d);
        }
        self.eat(b'[')?;
        let max = d.contract.max_rows();
        let mut candidate_ids = Vec::new();
        if !self.next_is(b']') {
            loop {
                if candidate_ids.len() == max {
                    return None;
                }
                candidate_ids.push(self.candidate(d)?);
                if !self.next_is(b',') {
                    self.eat(b']')?;
                    break;
                }
            }
        }
        d.candidate_ids = Some(candidate_ids);
        Some(())
    }

    /// A candidate `{"id": ..., "fields": {...}}` into the next row; its `id` as sent.
    fn candidate(&mut self, d: &mut Decoder<'_>) -> Option<Option<i64>> {
        let start = d.ids.len();
        d.ids.resize(start + d.fields, 0);
        let mut id: Option<Option<i64>> = None;
        let mut fields_read = false;
        self.object(|s, key| match key {
            b"id" if id.is_none() => {
                id = Some(if s.null() { None } else { Some(s.id()?) });
                Some(())
            }
            b"fields" if !fields_read => {
                fields_read = true;
                s.fields(d, Some(start))
            }
            _ => None,
        })?;
        let contract = d.contract;
        if !fields_read && !contract.item_fields.is_empty() {
            return None;
        }
        let id = id.flatten();
        if let Some(f) = contract.item_id_field {
            let value = id?;
            if !contract.takes_id(f, value) {
                return None;
            }
            d.ids[start + f] = value;
        }
        Some(id)
    }

    /// A `fields` object: the user's (`row_start` `None`) or the candidate's whose row starts at `row_start`;
    /// every expected field exactly once, each id one its table takes.
    fn fields(&mut self, d: &mut Decoder<'_>, row_start: Option<usize>) -> Option<()> {
        let contract = d.contract;
        let expected = match row_start {
            None => &contract.user_fields,
            Some(_) => &contract.item_fields,
        };
        d.seen.fill(false);
        let mut read = 0;
        // Where in `expected` the next key most likely is: clients send every object's fields in one order.
        let mut next = 0;
        self.eat(b'{')?;
        if self.next_is(b'}') {
            return (expected.is_empty()).then_some(());
        }
        loop {
            let hit = match expected.get(next) {
                Some(&f) => self.expected_key(contract.field_name(f).as_bytes())?,
                None => false,
            };
            let position = if hit {
                next
            } else {
                let f = contract.field_index(std::str::from_utf8(self.key()?).ok()?)?;
                expected.iter().position(|&e| e == f)?
            };
            next = position + 1;
            let f = expected[position];
            let id = self.id()?;
            if std::mem::replace(&mut d.seen[f], true) || !contract.takes_id(f, id) {
                return None;
            }
            match row_start {
                None => d.user_row[f] = id,
                Some(start) => d.ids[start + f] = id,
            }
            read += 1;
            if !self.next_is(b',') {
                self.eat(b'}')?;
                return (read == expected.len()).then_some(());
            }
        }
    }

    /// Steps past the key `"name"` and its colon if that key comes next (`Some(true)`); else stays where it is
    /// (`Some(false)`). Gives up on the key without its colon.
    fn expected_key(&mut self, name: &[u8]) -> Option<bool> {
        if !self.expected_string(name) {
            return Some(false);
        }
        self.eat(b':')?;
        Some(true)
    }

    /// Steps past the string `"name"` if it comes next, and says so.
    fn expected_string(&mut self, name: &[u8]) -> bool {
        self.skip_ws();
        let rest = &self.body[self.at..];
        let n = name.len();
        // A byte loop: names are a few bytes, shorter than a call to memcmp.
        let found = rest.len() > n + 1
            && rest[0] == b'"'
            && rest[n + 1] == b'"'
            && rest[1..=n].iter().zip(name).all(|(a, b)| a == b);
        if found {
            self.at += n + 2;
        }
        found
    }

    /// The columnar form of `candidates` ([`columnar`](super::columnar)): `fields`, `ids` and `id`, each at most
    /// once, in any order, finished as the serde decoder finishes them.
    fn columns(&mut self, d: &mut Decoder<'_>) -> Option<()> {
        let mut columns = Columns::default();
        self.object(|s, key| match key {
            b"fields" if columns.fields.is_none() => {
                columns.fields = Some(s.column_names(d)?);
                Some(())
            }
            b"ids" if columns.rows.is_none() => {
                columns.waiting = columns.fields.is_none();
                columns.rows = Some(s.id_rows(d, &columns)?);
                Some(())
            }
            b"id" if columns.id.is_none() => {
                let ids = s.item_ids(d.contract.max_rows())?;
                (columns.id_len, columns.id) = (ids.len(), Some(ids));
                Some(())
            }
            _ => None,
        })?;
        columns.finish(d).ok()
    }

    /// `candidates.fields`: every item field but the item id exactly once; the field of each column.
    fn column_names(&mut self, d: &mut Decoder<'_>) -> Option<Vec<usize>> {
        let contract = d.contract;
        let expected = &contract.item_fields;
        let mut fields = Vec::with_capacity(expected.len());
        d.seen.fill(false);
        self.eat(b'[')?;
        if !self.next_is(b']') {
            loop {
                // Clients name the columns in model.toml order: the `j`th item field's name first.
                let f = match expected.get(fields.len()) {
                    Some(&f) if self.expected_string(contract.field_name(f).as_bytes()) => f,
                    _ => {
                        let name = std::str::from_utf8(self.string()?).ok()?;
                        contract
                            .field_index(name)
                            .filter(|f| expected.contains(f))?
                    }
                };
                if std::mem::replace(&mut d.seen[f], true) {
                    return None;
                }
                fields.push(f);
                if !self.next_is(b',') {
                    self.eat(b']')?;
                    break;
                }
            }
        }
        (fields.len() == expected.len()).then_some(fields)
    }

    /// `candidates.ids`: at most [`RankContract::max_rows`] rows of one id per item field, each id to its place in
    /// its row (checked against its table now when `fields` came first, else when the columns are put in place).
    fn id_rows(&mut self, d: &mut Decoder<'_>, columns: &Columns) -> Option<usize> {
        let contract = d.contract;
        let places = columns.places(contract);
        let check = columns.fields.is_some();
        let max = contract.max_rows();
        let mut rows = 0;
        self.eat(b'[')?;
        if self.next_is(b']') {
            return Some(0);
        }
        loop {
            if rows == max {
                return None;
            }
            let start = d.ids.len();
            d.ids.resize(start + d.fields, 0);
            self.eat(b'[')?;
            for (j, &f) in places.iter().enumerate() {
                if j > 0 {
                    self.eat(b',')?;
                }
                let id = self.id()?;
                if check && !contract.takes_id(f, id) {
                    return None;
                }
                d.ids[start + f] = id;
            }
            self.eat(b']')?;
            rows += 1;
            if !self.next_is(b',') {
                self.eat(b']')?;
                return Some(rows);
            }
        }
    }

    /// `candidates.id`: an id or null per row, at most `max` (more: the serde decoder says how many).
    fn item_ids(&mut self, max: usize) -> Option<Vec<Option<i64>>> {
        let mut ids = Vec::new();
        self.eat(b'[')?;
        if self.next_is(b']') {
            return Some(ids);
        }
        loop {
            if ids.len() == max {
                return None;
            }
            ids.push(if self.null() { None } else { Some(self.id()?) });
            if !self.next_is(b',') {
                self.eat(b']')?;
                return Some(ids);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Decoder, decode_rank, decode_rank_serde};
    use super::scan;
    use recserve_core::ranking::RankContract;
    use recserve_core::testing::test_contract::{contract, wide_contract};

    /// Whether the fast path takes `body`; either way, `decode_rank` must answer as the serde decoder alone.
    fn taken(body: &str) -> bool {
        taken_by(&contract(), body)
    }

    fn taken_by(contract: &RankContract, body: &str) -> bool {
        let (both, serde) = (
            decode_rank(contract, body.as_bytes()),
            decode_rank_serde(contract, body.as_bytes()),
        );
        assert_eq!(format!("{both:?}"), format!("{serde:?}"), "for {body}");
        scan(&mut Decoder::new(contract), body.as_bytes()).is_some()
    }

    #[test]
    fn takes_the_bodies_clients_write() {
        for body in [
            r#"{"user":{"fields":{"u":3},"dense":[0.5,1]},"candidates":[{"id":4,"fields":{"cat":2}},{"id":0,"fields":{"cat":4}}]}"#,
            // Whitespace anywhere, members in any order, top_k, null ids of the open table, fields out of order.
            " {\n \"top_k\" : 1 , \"candidates\" : [ { \"fields\" : { \"cat\" : 0 } , \"id\" : 99 } ] ,\r\n\t\"user\" : { \"dense\" : [ 1e-3 , -2.5E2 ] , \"fields\" : { \"u\" : 9 } } } ",
            r#"{"user":{"fields":{"u":3},"dense":[0,0]},"candidates":[{"id":7,"fields":{"cat":1}}],"top_k":null}"#,
            // Valid JSON the server then refuses in finish(): no candidates, missing parts, too few dense values.
            r#"{"user":{"fields":{"u":3},"dense":[0,0]},"candidates":[]}"#,
            r#"{"candidates":[{"id":7,"fields":{"cat":1}}]}"#,
            r#"{"user":{"fields":{"u":3},"dense":[1]},"candidates":[{"id":7,"fields":{"cat":1}}]}"#,
            r#"{"user":{},"candidates":[{"id":7,"fields":{"cat":1}}]}"#,
            // The columnar form, its keys in any order (its own problems, found when its object ends, are left to
            // the serde decoder: below).
            r#"{"user":{"fields":{"u":3},"dense":[0.5,1]},"candidates":{"fields":["cat"],"ids":[[2],[4]],"id":[4,0]}}"#,
            " { \"candidates\" : { \"id\" : [ 4 , 0 ] , \"ids\" : [ [ 2 ] , [ 4 ] ] , \"fields\" : [ \"cat\" ] } , \"user\" : { \"fields\" : { \"u\" : 3 } } } ",
            r#"{"user":{"fields":{"u":3},"dense":[1]},"candidates":{"fields":["cat"],"ids":[[2]],"id":[7]},"top_k":2}"#,
        ] {
            assert!(taken(body), "the fast path gave up on {body}");
        }
        // Columns in model.toml order or not, before or after the ids.
        let wide = wide_contract();
        let user = r#""user":{"fields":{"u0":1,"u1":2,"u2":3},"dense":[0,0,0]}"#;
        for candidates in [
            r#"{"fields":["i0","i1","i2","i3"],"ids":[[1,2,3,4],[5,6,7,8]],"id":[1,2]}"#,
            r#"{"fields":["i3","i1","i0","i2"],"ids":[[1,2,3,4],[5,6,7,8]],"id":[1,2]}"#,
            r#"{"id":[1,2],"ids":[[1,2,3,4],[5,6,7,8]],"fields":["i2","i0","i3","i1"]}"#,
        ] {
            let body = format!(r#"{{{user},"candidates":{candidates}}}"#);
            assert!(taken_by(&wide, &body), "the fast path gave up on {body}");
        }
    }

    #[test]
    fn leaves_everything_else_to_the_serde_decoder() {
        let user = r#""user":{"fields":{"u":3},"dense":[0.5,1]}"#;
        for candidates in [
            r#"[{"id":-1,"fields":{"cat":2}}]"#,
            r#"[{"id":1.0,"fields":{"cat":2}}]"#,
            r#"[{"id":1e2,"fields":{"cat":2}}]"#,
            r#"[{"id":01,"fields":{"cat":2}}]"#,
            r#"[{"id":9223372036854775808,"fields":{"cat":2}}]"#,
            r#"[{"id":null,"fields":{"cat":2}}]"#,
            r#"[{"id":"4","fields":{"cat":2}}]"#,
            r#"[{"id":4,"fields":{"c\u0061t":2}}]"#,
            r#"[{"id":4,"fields":{"cat":2,"cat":3}}]"#,
            r#"[{"id":4,"id":4,"fields":{"cat":2}}]"#,
            r#"[{"id":4,"fields":{"cat":5}}]"#,
            r#"[{"id":4,"fields":{"u":1,"cat":2}}]"#,
            r#"[{"id":4,"fields":{}}]"#,
            r#"[{"id":4}]"#,
            r#"[{"id":4,"fields":{"cat":2},}]"#,
            r#"[{"id":4,"fields":{"cat":2}},]"#,
            r#"[{"id":4,"fields":{"cat":2}} {"id":5,"fields":{"cat":2}}]"#,
            r#"[{"id":4,"fields":{"cat":2},"score":1}]"#,
            r#"[{"id":4,"fields":{"cat":2}},{"id":4,"fields":{"cat":2}},{"id":4,"fields":{"cat":2}},{"id":4,"fields":{"cat":2}}]"#,
            r#"[{"id":4,"fields":{"cat":nul}}]"#,
            r#"[{"id":4,"fields":{"cat""cat":2}}]"#,
            r#"[{"id":4,"fields":{"cat" 2}}]"#,
            r#"{"id":4,"fields":{"cat":2}}"#,
        ] {
            let body = format!(r#"{{{user},"candidates":{candidates}}}"#);
            assert!(!taken(&body), "the fast path took {body}");
        }
        for candidates in [
            r#"{"fields":["cat"],"ids":[[2]],"id":[-1]}"#,
            r#"{"fields":["cat"],"ids":[[-2]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[5]],"id":[1]}"#,
            r#"{"fields":["c\u0061t"],"ids":[[2]],"id":[1]}"#,
            r#"{"fields":["cat","cat"],"ids":[[2,2]],"id":[1]}"#,
            r#"{"fields":["u"],"ids":[[2]],"id":[1]}"#,
            r#"{"fields":["item"],"ids":[[2]],"id":[1]}"#,
            r#"{"fields":[],"ids":[[]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[2,3]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[2]],"id":[1,2]}"#,
            r#"{"fields":["cat"],"ids":[[2]],"id":["1"]}"#,
            r#"{"fields":["cat"],"ids":[[2]]}"#,
            r#"{"fields":["cat"],"ids":[[2],[2],[2],[2]],"id":[1,2,3,4]}"#,
            r#"{"id":[1,2,3,4],"fields":["cat"],"ids":[[2]]}"#,
            r#"{"fields":["cat"],"fields":["cat"],"ids":[[2]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[2]],"ids":[[2]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[2]],"id":[1],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[2]],"id":[1],"x":1}"#,
            r#"{"fields":["cat"],"ids":[[2],],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[2],"id":[1]}"#,
            r#"{"fields":"cat","ids":[[2]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[2.0]],"id":[1]}"#,
            r#"{"fields":["cat"],"ids":[[2]],"id":[null]}"#,
            r#"{"fields":["cat"],"ids":[[2]],"id":[]}"#,
            r#"{"fields":["cat"],"ids":[],"id":[]}"#,
            r#"{"ids":[[5]],"fields":["cat"],"id":[1]}"#,
            r#"{"ids":[[2]],"id":[1]}"#,
            "{}",
        ] {
            let body = format!(r#"{{{user},"candidates":{candidates}}}"#);
            assert!(!taken(&body), "the fast path took {body}");
        }
        let candidates = r#""candidates":[{"id":4,"fields":{"cat":2}}]"#;
        for user in [
            r#"{"fields":{"u":10},"dense":[0.5,1]}"#,
            r#"{"fields":{"u":3},"dense":[1e39,1]}"#,
            r#"{"fields":{"u":3},"dense":[0.5,"1"]}"#,
            r#"{"fields":{"u":3},"dense":[0.5,1,]}"#,
            r#"{"fields":{"u":3},"dense":[0.5 1]}"#,
            r#"{"fields":{"u":3},"dense":null}"#,
            r#"{"fields":{"u":3},"fields":{"u":3}}"#,
            r#"{"fields":{"u":3,"extra":1}}"#,
            r#"{"fields":{"cat":3}}"#,
            r#"{"dense":[1,2],"dense":[1,2]}"#,
            "null",
        ] {
            let body = format!(r#"{{"user":{user},{candidates}}}"#);
            assert!(!taken(&body), "the fast path took {body}");
        }
        for body in [
            format!(r#"{{"user":{{"fields":{{"u":3}}}},{candidates},"top_k":0}}"#),
            format!(r#"{{"user":{{"fields":{{"u":3}}}},{candidates},"top_k":-1}}"#),
            format!(r#"{{"user":{{"fields":{{"u":3}}}},{candidates},"top_k":1,"top_k":1}}"#),
            format!(r#"{{"user":{{"fields":{{"u":3}}}},{candidates}}} x"#),
            format!(r#"{{"user":{{"fields":{{"u":3}}}},{candidates}"#),
            format!(r#"{{"user":{{"fields":{{"u":3}}}},{candidates},"other":1}}"#),
            format!("{{\"user\":{{\"fields\":{{\"u\":3}}}},{candidates},\"top\u{1}k\":1}}"),
            format!(r#"{{"user":{{"fields":{{"u":3}}}},{candidates},}}"#),
            format!(r#"[{{"user":{{"fields":{{"u":3}}}},{candidates}}}]"#),
        ] {
            assert!(!taken(&body), "the fast path took {body}");
        }
    }
}

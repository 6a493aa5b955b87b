//! `COPY stream FROM STDIN` in text and CSV formats.
//!
//! Invariant: the whole input is parsed and checked before any row reaches the engine,
//! so a bad line fails the statement and applies nothing. A line `\.` ends the data, as
//! psql sends it from scripts. Complete records are parsed as they arrive and held as
//! Arrow batches (a few bytes per value, not a `Value` each), and the raw text is let
//! go: a COPY holds about its columnar size, within `session_memory_bytes`
//! (`limits`).

use std::borrow::Cow;
use std::sync::Arc;

use tokio::sync::oneshot;

use datafusion::sql::sqlparser::ast::{
    CopyLegacyOption, CopyOption, CopySource, CopyTarget, Statement,
};

use eddy_planner::bind::load_target;
use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::sql::{normalize_ident, object_name};
use eddy_planner::types::{ColumnType, Value};
use eddy_planner::{Error, ErrorKind, Result};

use datafusion::arrow::record_batch::RecordBatch;
use eddy_cluster::exec::passes::{Passes, Predicates};
use eddy_cluster::Task;

use crate::ops::limits::{Limit, Limits};
use eddy_planner::bind::{check_not_null, value_from_text};
use eddy_planner::filter::BatchBuilder;

/// Rows per Arrow batch a COPY holds, and per batch it hands to the engine.
pub const COPY_BATCH_ROWS: usize = 8192;

/// Bytes of complete records handed to one parse job.
const CHUNK_BYTES: usize = 256 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Text,
    Csv,
}

/// Runs a parse job somewhere: on a shard, through the round-robin balancer.
pub type Runner = Arc<dyn Fn(Box<dyn FnOnce() + Send>) + Send + Sync>;

/// How a COPY's text becomes rows: shared by the session and the jobs parsing on shards.
struct Parser {
    stream: Arc<StreamDef>,
    /// The WHERE predicates of the stream's metrics, evaluated where the rows are parsed.
    predicates: Predicates,
    targets: Vec<usize>,
    /// For each column, the field of a record that sets it (the inverse of `targets`).
    field_of: Vec<Option<usize>>,
    format: Format,
    delimiter: char,
    null: String,
    quote: char,
}

/// The rows of some complete records, checked, as Arrow batches.
struct Parsed {
    batches: Vec<ParsedBatch>,
    rows: usize,
    /// Records seen (the header and rows; not the lines after `\.`).
    records: usize,
    /// The `\.` line was among them: the data ends there.
    ended: bool,
    bytes: usize,
}

/// A chunk of complete records, in input order: parsed, or being parsed by a job (which
/// hands back its text when it fails, to be parsed again with its line numbers).
enum Chunk {
    Parsed(std::result::Result<Parsed, Vec<u8>>),
    Parsing {
        result: oneshot::Receiver<std::result::Result<Parsed, Vec<u8>>>,
        bytes: usize,
    },
}

impl Chunk {
    fn bytes(&self) -> usize {
        match self {
            Chunk::Parsed(Ok(p)) => p.bytes,
            Chunk::Parsed(Err(text)) => text.len(),
            Chunk::Parsing { bytes, .. } => *bytes,
        }
    }

    /// Takes a job's result if it is there; false while the job runs.
    fn poll(&mut self) -> bool {
        if let Chunk::Parsing { result, .. } = self {
            match result.try_recv() {
                Ok(parsed) => *self = Chunk::Parsed(parsed),
                Err(_) => return false,
            }
        }
        true
    }

    /// The data needs nothing after this chunk: it failed, or it holds the `\.` line.
    fn is_last(&self) -> bool {
        matches!(
            self,
            Chunk::Parsed(Err(_)) | Chunk::Parsed(Ok(Parsed { ended: true, .. }))
        )
    }
}

/// A COPY FROM STDIN in progress: its target and the data received so far.
pub struct CopyIn {
    pub stream: Arc<StreamDef>,
    parser: Arc<Parser>,
    header: bool,
    /// Received bytes after the last complete record.
    pending: Vec<u8>,
    /// How much of `pending` was searched for a record end, and whether that search
    /// ended inside a CSV quoted field.
    scanned: usize,
    /// Where in `pending` the record being received starts.
    row_start: usize,
    in_quotes: bool,
    /// Complete records not yet parsed.
    ready: Vec<u8>,
    chunks: Vec<Chunk>,
    /// Chunks before this one are parsed, and `parsed_bytes` is what they hold.
    polled: usize,
    parsed_bytes: usize,
    /// A chunk failed or held the `\.` line: later data cannot change the outcome.
    decided: bool,
    /// The header line is still to come (parsed on the caller, then skipped).
    header_pending: bool,
    /// Where parse jobs run (`None`: on the caller).
    runner: Option<Runner>,
    /// The first error of the data as a whole (too large); the statement fails with it
    /// when the data ends.
    failed: Option<Error>,
    /// `session_memory_bytes` and `max_copy_row_bytes` when the COPY began.
    limits: Arc<Limits>,
}

/// Checked rows, and whether each passes each WHERE of the stream's metrics.
pub type ParsedBatch = (RecordBatch, Option<Passes>);

/// The rows of a finished COPY, checked, as batches in input order.
pub struct CopyRows {
    pub stream: Arc<StreamDef>,
    pub batches: Vec<ParsedBatch>,
    pub rows: usize,
}

impl CopyIn {
    pub fn bind(catalog: &Catalog, stmt: &Statement) -> Result<CopyIn> {
        let Statement::Copy {
            source,
            to,
            target,
            options,
            legacy_options,
            ..
        } = stmt
        else {
            return Err(Error::internal("not a COPY statement"));
        };
        if *to {
            return Err(Error::unsupported("COPY … TO is not supported")
                .with_hint("Read streams and metrics with SELECT."));
        }
        if !matches!(target, CopyTarget::Stdin) {
            return Err(Error::unsupported("COPY FROM reads only STDIN")
                .with_hint("Use psql's \\copy to load a client-side file."));
        }
        let CopySource::Table {
            table_name,
            columns,
        } = source
        else {
            return Err(Error::unsupported("COPY FROM needs a stream name"));
        };
        let names: Vec<String> = columns.iter().map(normalize_ident).collect();
        let (stream, targets) = load_target(catalog, &object_name(table_name), &names, "copy")?;
        let mut field_of = vec![None; stream.columns.len()];
        for (f, &c) in targets.iter().enumerate() {
            field_of[c] = Some(f);
        }
        let mut parser = Parser {
            stream: stream.clone(),
            predicates: Predicates::of(catalog, &stream)?,
            targets,
            field_of,
            format: Format::Text,
            delimiter: '\t',
            null: "\\N".to_string(),
            quote: '"',
        };
        let mut header = false;
        let mut delimiter = None;
        let mut null = None;
        for o in options {
            match o {
                CopyOption::Format(f) => {
                    parser.format = match f.value.to_lowercase().as_str() {
                        "csv" => Format::Csv,
                        "text" => Format::Text,
                        other => {
                            return Err(Error::unsupported(format!(
                                "COPY format \"{other}\" is not supported"
                            ))
                            .with_hint("Use FORMAT csv or FORMAT text."))
                        }
                    }
                }
                CopyOption::Delimiter(c) => delimiter = Some(*c),
                CopyOption::Null(s) => null = Some(s.clone()),
                CopyOption::Header(h) => header = *h,
                CopyOption::Quote(c) => parser.quote = *c,
                CopyOption::Encoding(_) | CopyOption::Freeze(_) => {}
                other => {
                    return Err(Error::unsupported(format!(
                        "COPY option {other} is not supported"
                    )))
                }
            }
        }
        for o in legacy_options {
            match o {
                CopyLegacyOption::Csv(_) => parser.format = Format::Csv,
                CopyLegacyOption::Delimiter(c) => delimiter = Some(*c),
                CopyLegacyOption::Null(s) => null = Some(s.clone()),
                other => {
                    return Err(Error::unsupported(format!(
                        "COPY option {other} is not supported"
                    )))
                }
            }
        }
        if parser.format == Format::Csv {
            parser.delimiter = ',';
            parser.null = String::new();
        }
        if let Some(d) = delimiter {
            parser.delimiter = d;
        }
        if let Some(n) = null {
            parser.null = n;
        }
        Ok(CopyIn {
            stream,
            parser: Arc::new(parser),
            header,
            pending: Vec::new(),
            scanned: 0,
            row_start: 0,
            in_quotes: false,
            ready: Vec::new(),
            chunks: Vec::new(),
            polled: 0,
            parsed_bytes: 0,
            decided: false,
            header_pending: header,
            runner: None,
            failed: None,
            limits: Arc::new(Limits::default()),
        })
    }

    /// Holds the COPY to these limits instead of the defaults.
    pub fn limit(&mut self, limits: Arc<Limits>) {
        self.limits = limits;
    }

    /// Parses the data's chunks with `runner` (on the shards) instead of the caller.
    pub fn parse_with(&mut self, runner: Runner) {
        self.runner = Some(runner);
    }

    /// The number of columns the client sends per line.
    pub fn columns(&self) -> usize {
        self.parser.targets.len()
    }

    /// Takes the next bytes of the data: hands complete records to a parser once there
    /// are enough of them.
    pub fn push(&mut self, bytes: &[u8]) -> Result<()> {
        if self.failed.is_some() || self.decided {
            return Ok(());
        }
        self.pending.extend_from_slice(bytes);
        // CSV quotes toggle whether a newline ends a record; a quote that is not one
        // byte is never a byte of the data.
        let quote = u8::try_from(self.parser.quote as u32)
            .ok()
            .filter(|_| self.parser.format == Format::Csv);
        let unscanned = &self.pending[self.scanned..];
        let marks: Box<dyn Iterator<Item = usize>> = match quote {
            Some(q) => Box::new(memchr::memchr2_iter(b'\n', q, unscanned)),
            None => Box::new(memchr::memchr_iter(b'\n', unscanned)),
        };
        let mut end = None;
        let mut longest = 0;
        for i in marks.map(|i| i + self.scanned) {
            if self.pending[i] != b'\n' {
                self.in_quotes = !self.in_quotes;
            } else if !self.in_quotes {
                longest = longest.max(i + 1 - self.row_start);
                self.row_start = i + 1;
                end = Some(i + 1);
            }
        }
        self.scanned = self.pending.len();
        longest = longest.max(self.pending.len() - self.row_start);
        if let Some(end) = end {
            let rest = self.pending.split_off(end);
            let complete = std::mem::replace(&mut self.pending, rest);
            self.scanned -= end;
            self.row_start -= end;
            self.ready.extend_from_slice(&complete);
            if self.ready.len() >= CHUNK_BYTES {
                self.parse_ready();
            }
        }
        let held = self.held_bytes() as u64;
        let too_much = self
            .limits
            .check(Limit::CopyRowBytes, longest as u64, "a row of COPY data")
            .and_then(|_| {
                self.limits
                    .check(Limit::SessionMemoryBytes, held, "the COPY data held")
            });
        if let Err(e) = too_much {
            self.failed = Some(e);
            self.pending = Vec::new();
            self.ready = Vec::new();
            self.chunks = Vec::new();
        }
        Ok(())
    }

    /// What the COPY holds: text not parsed yet, and parsed rows. Takes the results of
    /// the jobs that finished, in order.
    fn held_bytes(&mut self) -> usize {
        while let Some(chunk) = self.chunks.get_mut(self.polled) {
            if !chunk.poll() {
                break;
            }
            self.parsed_bytes += chunk.bytes();
            self.decided |= chunk.is_last();
            self.polled += 1;
        }
        let parsing: usize = self.chunks[self.polled..].iter().map(Chunk::bytes).sum();
        self.pending.len() + self.ready.len() + self.parsed_bytes + parsing
    }

    /// Hands the complete records received so far to a parser. The first chunk of a
    /// COPY with a header is parsed here, so the header is known to be in it.
    fn parse_ready(&mut self) {
        let text = std::mem::take(&mut self.ready);
        if text.is_empty() {
            return;
        }
        let parser = self.parser.clone();
        let header = self.header_pending;
        let runner = self.runner.as_ref().filter(|_| !header);
        let Some(runner) = runner else {
            let parsed = parser.parse(&text, 0, header).map_err(|_| text);
            if let Ok(p) = &parsed {
                self.header_pending &= p.records == 0;
            }
            self.chunks.push(Chunk::Parsed(parsed));
            return;
        };
        let (tx, result) = oneshot::channel();
        let bytes = text.len();
        runner(Box::new(move || {
            let _ = tx.send(parser.parse(&text, 0, false).map_err(|_| text));
        }));
        self.chunks.push(Chunk::Parsing { result, bytes });
    }

    /// Every row of the data, checked, once the client sent all of it.
    pub async fn finish(mut self) -> Result<CopyRows> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.ready.append(&mut self.pending);
        self.parse_ready();
        let mut batches = Vec::new();
        let (mut rows, mut records) = (0, 0);
        for chunk in self.chunks {
            let parsed = match chunk {
                Chunk::Parsed(parsed) => parsed,
                Chunk::Parsing { result, .. } => result
                    .await
                    .map_err(|_| Error::internal("a COPY parse job was dropped"))?,
            };
            let parsed = match parsed {
                Ok(parsed) => parsed,
                // Again, knowing where it starts: the error names its line.
                Err(text) => self
                    .parser
                    .parse(&text, records, self.header && records == 0)?,
            };
            records += parsed.records;
            rows += parsed.rows;
            batches.extend(parsed.batches);
            if parsed.ended {
                break;
            }
        }
        Ok(CopyRows {
            stream: self.stream,
            batches,
            rows,
        })
    }
}

impl Parser {
    /// Parses and checks whole records, `before` of them preceding these in the data
    /// (for line numbers); with `header`, the first is a header and skipped.
    fn parse(&self, bytes: &[u8], before: usize, header: bool) -> Result<Parsed> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| Error::new(ErrorKind::InvalidText, "COPY data is not valid UTF-8"))?;
        let mut stager = Stager::new(self, before, header);
        let ended = match self.format {
            Format::Csv => {
                let (records, ended) = self.csv_records(text)?;
                for fields in &records {
                    stager.record(fields)?;
                }
                ended
            }
            Format::Text => {
                let mut fields = Vec::with_capacity(self.targets.len());
                let mut ended = false;
                for line in text.split('\n') {
                    let line = line.strip_suffix('\r').unwrap_or(line);
                    if line == "\\." {
                        ended = true;
                        break;
                    }
                    if !line.is_empty() {
                        fields.clear();
                        fields.extend(self.text_fields(line));
                        stager.record(&fields)?;
                    }
                }
                ended
            }
        };
        stager.finish(ended)
    }

    /// A text line's fields, borrowed from the line unless they hold escapes.
    fn text_fields<'a>(&'a self, line: &'a str) -> impl Iterator<Item = Option<Cow<'a, str>>> {
        line.split(self.delimiter)
            .map(|f| (f != self.null).then(|| unescape_text(f)))
    }

    /// RFC 4180 records: quoted fields may hold delimiters, quotes (doubled) and newlines;
    /// an unquoted field equal to the NULL string is NULL.
    /// Also says whether the `\\.` line ended the data.
    fn csv_records(&self, text: &str) -> Result<(Vec<Vec<Option<String>>>, bool)> {
        let mut records = Vec::new();
        let mut fields: Vec<Option<String>> = Vec::new();
        let mut field = String::new();
        let mut quoted = false;
        let mut in_quotes = false;
        let mut chars = text.chars().peekable();
        let mut at_line_start = true;
        while let Some(c) = chars.next() {
            if at_line_start && !in_quotes && c == '\\' && chars.peek() == Some(&'.') {
                // The end-of-data marker `\.` on a line of its own.
                let rest: String = chars.clone().take(3).collect();
                if rest == "." || rest.starts_with(".\n") || rest.starts_with(".\r") {
                    return Ok((records, true));
                }
            }
            at_line_start = false;
            if in_quotes {
                if c == self.quote {
                    if chars.peek() == Some(&self.quote) {
                        field.push(self.quote);
                        chars.next();
                    } else {
                        in_quotes = false;
                    }
                } else {
                    field.push(c);
                }
                continue;
            }
            if c == self.quote {
                in_quotes = true;
                quoted = true;
            } else if c == self.delimiter {
                fields.push(self.csv_field(&mut field, &mut quoted));
            } else if c == '\n' || c == '\r' {
                if c == '\r' && chars.peek() == Some(&'\n') {
                    chars.next();
                }
                fields.push(self.csv_field(&mut field, &mut quoted));
                if !(fields.len() == 1 && fields[0].is_none()) || self.targets.len() == 1 {
                    records.push(std::mem::take(&mut fields));
                } else {
                    fields.clear();
                }
                at_line_start = true;
            } else {
                field.push(c);
            }
        }
        if in_quotes {
            return Err(Error::new(
                ErrorKind::BadCopyFormat,
                "unterminated CSV quoted field",
            ));
        }
        if !field.is_empty() || quoted || !fields.is_empty() {
            fields.push(self.csv_field(&mut field, &mut quoted));
            records.push(fields);
        }
        Ok((records, false))
    }

    fn csv_field(&self, field: &mut String, quoted: &mut bool) -> Option<String> {
        let text = std::mem::take(field);
        let was_quoted = std::mem::replace(quoted, false);
        if !was_quoted && text == self.null {
            None
        } else {
            Some(text)
        }
    }
}

/// A parse job's records, checked one at a time and staged as Arrow batches of
/// `COPY_BATCH_ROWS` rows.
struct Stager<'p> {
    parser: &'p Parser,
    parsed: Parsed,
    batch: BatchBuilder,
    /// The record being checked, as a row; a text value stands there as `text` and the
    /// batch takes it from the record's field (`Parser::field_of`), so no row owns its text.
    row: Vec<Value>,
    text: Value,
    before: usize,
    header: bool,
}

impl<'p> Stager<'p> {
    fn new(parser: &'p Parser, before: usize, header: bool) -> Stager<'p> {
        Stager {
            parser,
            parsed: Parsed {
                batches: Vec::new(),
                rows: 0,
                records: 0,
                ended: false,
                bytes: 0,
            },
            batch: BatchBuilder::new(&parser.stream, COPY_BATCH_ROWS),
            row: parser.stream.blank_row(),
            text: Value::Text("".into()),
            before,
            header,
        }
    }

    /// Checks one record's text fields and stages its row.
    fn record<S: AsRef<str>>(&mut self, fields: &[Option<S>]) -> Result<()> {
        self.parsed.records += 1;
        if self.header && self.parsed.records == 1 {
            return Ok(());
        }
        let line = self.before + self.parsed.records;
        let (stream, targets) = (&self.parser.stream, &self.parser.targets);
        if fields.len() != targets.len() {
            return Err(Error::new(
                ErrorKind::BadCopyFormat,
                format!(
                    "line {line}: expected {} columns, found {}",
                    targets.len(),
                    fields.len()
                ),
            ));
        }
        // The columns the COPY leaves out keep their defaults; those it names are set.
        for &c in targets {
            self.row[c] = Value::Null;
        }
        for (f, &c) in fields.iter().zip(targets) {
            let (Some(text), col) = (f, &stream.columns[c]) else {
                continue;
            };
            self.row[c] = match col.ty {
                ColumnType::Text => self.text.clone(),
                _ => value_from_text(text.as_ref(), col).map_err(|mut e| {
                    e.detail = Some(format!(
                        "COPY {}, line {line}, column {}",
                        stream.name, col.name
                    ));
                    e
                })?,
            };
        }
        check_not_null(stream, &self.row)?;
        Task::event_time(stream, &self.row)?;
        for (c, v) in self.row.iter().enumerate() {
            let column = self.batch.column(c);
            match (v, self.parser.field_of[c].and_then(|f| fields[f].as_ref())) {
                (Value::Text(_), Some(text)) => column.push_text(text.as_ref()),
                _ => column.push(v),
            }
        }
        self.batch.end_row();
        if self.batch.rows() >= COPY_BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    /// Ends the batch being staged.
    fn flush(&mut self) -> Result<()> {
        let rows = self.batch.rows();
        if rows == 0 {
            return Ok(());
        }
        let batch = self.batch.finish()?;
        let predicates = &self.parser.predicates;
        let passes = match predicates.is_empty() {
            true => None,
            false => Some(predicates.evaluate(&batch)?),
        };
        self.parsed.rows += rows;
        self.parsed.bytes += batch.get_array_memory_size();
        self.parsed.batches.push((batch, passes));
        Ok(())
    }

    fn finish(mut self, ended: bool) -> Result<Parsed> {
        self.flush()?;
        self.parsed.ended = ended;
        Ok(self.parsed)
    }
}

/// Undoes COPY text format's backslash escapes.
fn unescape_text(f: &str) -> Cow<'_, str> {
    if !f.contains('\\') {
        return Cow::Borrowed(f);
    }
    let mut out = String::with_capacity(f.len());
    let mut chars = f.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

/// Encodes result rows as the lines of a `COPY … TO STDOUT`, text or CSV, as
/// PostgreSQL's `CopyAttributeOutText` and `CopyAttributeOutCSV` write them: in text,
/// backslash, the delimiter and the control characters `\b \f \n \r \t \v` are
/// escaped; in CSV, a value is quoted when it holds the delimiter, a quote or a line
/// break, or equals the NULL string (so `''` and NULL differ), or is `\.` alone.
///
/// Rows come as cells (`line`, `lines`) or as Arrow batches (`batch`), whose common
/// columns are formatted straight from the arrays, with no cell per value. (pgwire's
/// `CopyEncoder` allocates per field and does not quote an empty CSV string.)
pub struct CopyLines {
    csv: bool,
    delimiter: char,
    null: String,
    /// One column: `\.` alone on a CSV line is quoted (it would end the data).
    single: bool,
    header: Option<Vec<u8>>,
    /// A value's text, reused from value to value.
    text: String,
}

impl CopyLines {
    pub fn new(
        columns: &[crate::session::cells::Column],
        copy: &eddy_planner::sql::CopyOut,
    ) -> CopyLines {
        let header = (copy.csv && copy.header).then(|| {
            let mut line = Vec::new();
            for (i, c) in columns.iter().enumerate() {
                if i > 0 {
                    push_char(&mut line, copy.delimiter);
                }
                let special = c.name.contains(copy.delimiter) || c.name.contains(['"', '\n', '\r']);
                if special {
                    line.push(b'"');
                    line.extend_from_slice(c.name.replace('"', "\"\"").as_bytes());
                    line.push(b'"');
                } else {
                    line.extend_from_slice(c.name.as_bytes());
                }
            }
            line.push(b'\n');
            line
        });
        CopyLines {
            csv: copy.csv,
            delimiter: copy.delimiter,
            null: copy.null.clone(),
            single: columns.len() == 1,
            header,
            text: String::new(),
        }
    }

    /// The header line, once (CSV with HEADER).
    pub fn header(&mut self) -> Option<Vec<u8>> {
        self.header.take()
    }

    /// One row as one line.
    pub fn line(&mut self, row: Vec<crate::session::cells::Cell>) -> Vec<u8> {
        self.lines(&[row])
    }

    /// Rows as lines, one after another in one buffer (sent as one CopyData message).
    pub fn lines(&mut self, rows: &[Vec<crate::session::cells::Cell>]) -> Vec<u8> {
        let mut out = Vec::with_capacity(rows.len() * 64);
        for row in rows {
            for (i, cell) in row.iter().enumerate() {
                self.text.clear();
                let present = cell.write_text(&mut self.text);
                self.field(i, present, &mut out);
            }
            out.push(b'\n');
        }
        out
    }

    /// A batch's rows as lines, in one buffer.
    pub fn batch(&mut self, batch: &RecordBatch) -> Vec<u8> {
        use datafusion::arrow::array::Array;
        let columns: Vec<(&dyn Array, TextColumn)> = batch
            .columns()
            .iter()
            .map(|a| (a.as_ref(), TextColumn::of(a)))
            .collect();
        let mut out = Vec::with_capacity(batch.num_rows() * 12 * columns.len().max(1));
        for row in 0..batch.num_rows() {
            for (i, (array, column)) in columns.iter().enumerate() {
                self.text.clear();
                let present = !array.is_null(row) && column.write(row, &mut self.text);
                self.field(i, present, &mut out);
            }
            out.push(b'\n');
        }
        out
    }

    /// Appends field `i` of a line, whose text is `self.text` (NULL unless `present`).
    fn field(&self, i: usize, present: bool, out: &mut Vec<u8>) {
        if i > 0 {
            push_char(out, self.delimiter);
        }
        let text = self.text.as_str();
        if !present {
            out.extend_from_slice(self.null.as_bytes());
        } else if self.csv {
            let quote = text == self.null
                || (self.single && text == "\\.")
                || text.contains([self.delimiter, '"', '\n', '\r']);
            if quote {
                out.push(b'"');
                for b in text.bytes() {
                    if b == b'"' {
                        out.push(b'"');
                    }
                    out.push(b);
                }
                out.push(b'"');
            } else {
                out.extend_from_slice(text.as_bytes());
            }
        } else {
            let delimiter = self.delimiter;
            let plain = !text.bytes().any(|b| b < 0x20 || b == b'\\') && !text.contains(delimiter);
            if plain {
                out.extend_from_slice(text.as_bytes());
                return;
            }
            for c in text.chars() {
                let escaped = match c {
                    '\\' => "\\\\",
                    '\u{8}' => "\\b",
                    '\u{c}' => "\\f",
                    '\n' => "\\n",
                    '\r' => "\\r",
                    '\t' => "\\t",
                    '\u{b}' => "\\v",
                    c if c == delimiter => {
                        out.push(b'\\');
                        push_char(out, c);
                        continue;
                    }
                    c => {
                        push_char(out, c);
                        continue;
                    }
                };
                out.extend_from_slice(escaped.as_bytes());
            }
        }
    }
}

fn push_char(out: &mut Vec<u8>, c: char) {
    out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
}

/// A batch column whose values COPY writes: the common types straight from the
/// array, any other through its cells (`cells_of_array`), so every type's text is the
/// one `Cell::write_text` gives.
enum TextColumn<'a> {
    Bool(&'a datafusion::arrow::array::BooleanArray),
    I32(&'a datafusion::arrow::array::Int32Array),
    I64(&'a datafusion::arrow::array::Int64Array),
    F32(&'a datafusion::arrow::array::Float32Array),
    F64(&'a datafusion::arrow::array::Float64Array),
    Utf8(&'a datafusion::arrow::array::StringArray),
    View(&'a datafusion::arrow::array::StringViewArray),
    Timestamp(&'a datafusion::arrow::array::TimestampMicrosecondArray),
    Cells(Vec<crate::session::cells::Cell>),
}

impl<'a> TextColumn<'a> {
    fn of(array: &'a datafusion::arrow::array::ArrayRef) -> TextColumn<'a> {
        use datafusion::arrow::array::AsArray;
        use datafusion::arrow::datatypes::{
            DataType, Float32Type, Float64Type, Int32Type, Int64Type, TimeUnit,
            TimestampMicrosecondType,
        };
        match array.data_type() {
            DataType::Boolean => TextColumn::Bool(array.as_boolean()),
            DataType::Int32 => TextColumn::I32(array.as_primitive::<Int32Type>()),
            DataType::Int64 => TextColumn::I64(array.as_primitive::<Int64Type>()),
            DataType::Float32 => TextColumn::F32(array.as_primitive::<Float32Type>()),
            DataType::Float64 => TextColumn::F64(array.as_primitive::<Float64Type>()),
            DataType::Utf8 => TextColumn::Utf8(array.as_string::<i32>()),
            DataType::Utf8View => TextColumn::View(array.as_string_view()),
            DataType::Timestamp(TimeUnit::Microsecond, None) => {
                TextColumn::Timestamp(array.as_primitive::<TimestampMicrosecondType>())
            }
            _ => TextColumn::Cells(crate::session::cells::cells_of_array(array)),
        }
    }

    /// Appends value `i`'s text to `out` (the caller saw it is not NULL in the array;
    /// cells say for themselves); `false` for NULL.
    fn write(&self, i: usize, out: &mut String) -> bool {
        match self {
            TextColumn::Bool(a) => out.push(if a.value(i) { 't' } else { 'f' }),
            TextColumn::I32(a) => out.push_str(itoa::Buffer::new().format(a.value(i))),
            TextColumn::I64(a) => out.push_str(itoa::Buffer::new().format(a.value(i))),
            TextColumn::F32(a) => eddy_planner::types::write_float4(a.value(i), out),
            TextColumn::F64(a) => eddy_planner::types::write_float(a.value(i), out),
            TextColumn::Utf8(a) => out.push_str(a.value(i)),
            TextColumn::View(a) => out.push_str(a.value(i)),
            TextColumn::Timestamp(a) => eddy_planner::types::write_timestamp(a.value(i), out),
            TextColumn::Cells(cells) => return cells[i].write_text(out),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_planner::sql::parse_statement;

    fn copy_for(sql: &str) -> CopyIn {
        let mut catalog = Catalog::default();
        let create = parse_statement(
            "CREATE STREAM s (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, note TEXT) WITH (event_time = 'ts')",
        )
        .unwrap();
        catalog = eddy_planner::ddl::apply(&catalog, &create).unwrap().0;
        let Ok(eddy_planner::sql::Statement::Copy(stmt)) = parse_statement(sql) else {
            panic!("not a copy")
        };
        CopyIn::bind(&catalog, &stmt).unwrap()
    }

    fn rows(c: CopyIn) -> Result<Vec<Vec<Value>>> {
        let finished = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(c.finish());
        let mut out = Vec::new();
        for (b, _) in &finished?.batches {
            out.extend(
                eddy_planner::filter::batch_to_rows(b)?
                    .iter()
                    .map(|r| r.to_vec()),
            );
        }
        Ok(out)
    }

    #[test]
    fn csv_quotes_nulls_and_end_marker() {
        let mut c = copy_for("COPY s FROM STDIN (FORMAT csv)");
        c.push(b"1,2026-01-01 00:00:00,\"a, \"\"b\"\"\"\n2,2026-01-01 00:00:01,\n\\.\n3,x,y\n")
            .unwrap();
        let rows = rows(c).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][2], Value::Text("a, \"b\"".into()));
        assert_eq!(rows[1][2], Value::Null);
    }

    #[test]
    fn text_format_escapes_and_bad_line() {
        let mut c = copy_for("COPY s FROM STDIN");
        c.push(b"1\t2026-01-01 00:00:00\t\\N\n").unwrap();
        assert_eq!(rows(c).unwrap()[0][2], Value::Null);
        let mut c = copy_for("COPY s FROM STDIN");
        c.push(b"1\t2026-01-01 00:00:00\t\\N\n").unwrap();
        c.push(b"oops\t2026-01-01\tx\n").unwrap();
        assert_eq!(rows(c).unwrap_err().kind, ErrorKind::InvalidText);
        // Escapes are undone; a plain field next to them is kept as it is.
        let mut c = copy_for("COPY s FROM STDIN");
        c.push(b"1\t2026-01-01 00:00:00\ta\\tb\\\\c\\nd\n2\t2026-01-01 00:00:01\tplain\n")
            .unwrap();
        let rows = rows(c).unwrap();
        assert_eq!(rows[0][2], Value::Text("a\tb\\c\nd".into()));
        assert_eq!(rows[1][2], Value::Text("plain".into()));
    }

    /// Data cut anywhere, even inside a quoted field with a newline or inside a UTF-8
    /// character, gives the rows of the whole; the error of a bad row holds its line.
    #[test]
    fn records_split_across_messages() {
        let data = "h1,h2,h3\n1,2026-01-01 00:00:00,\"multi\nline, \"\"q\"\"\"\n\
                    2,2026-01-01 00:00:01,é€\n3,2026-01-01 00:00:02,\n4,2026-01-01 00:00:03,last";
        let whole = {
            let mut c = copy_for("COPY s FROM STDIN (FORMAT csv, HEADER)");
            c.push(data.as_bytes()).unwrap();
            rows(c).unwrap()
        };
        assert_eq!(whole.len(), 4);
        assert_eq!(whole[0][2], Value::Text("multi\nline, \"q\"".into()));
        assert_eq!(whole[1][2], Value::Text("é€".into()));
        for cut in 1..data.len() {
            let mut c = copy_for("COPY s FROM STDIN (FORMAT csv, HEADER)");
            c.push(&data.as_bytes()[..cut]).unwrap();
            c.push(&data.as_bytes()[cut..]).unwrap();
            assert_eq!(rows(c).unwrap(), whole, "cut at {cut}");
        }
        let mut c = copy_for("COPY s FROM STDIN (FORMAT csv)");
        c.push(b"1,2026-01-01 00:00:00,a\n").unwrap();
        c.push(b"2,2026-01-01 00:00:01,b\nx,2026-01-01 00:00:02,c\n")
            .unwrap();
        c.push(b"4,2026-01-01 00:00:03,d\n").unwrap();
        let e = rows(c).unwrap_err();
        assert!(format!("{e:?}").contains("line 3"), "{e:?}");
    }

    /// Parse jobs on other threads (as on the shards) give the rows, the line numbers
    /// and the end of the data exactly as parsing on the caller does.
    #[test]
    fn parsing_elsewhere_changes_nothing() {
        let line = |i: usize| format!("{i},2026-01-01 00:00:00,note {i} {}\n", "x".repeat(i % 50));
        let data: String = (0..40_000).map(line).collect();
        assert!(data.len() > 4 * CHUNK_BYTES);
        let runner: Runner = Arc::new(|job| {
            std::thread::spawn(job);
        });
        let load = |data: &str, elsewhere: bool| {
            let mut c = copy_for("COPY s FROM STDIN (FORMAT csv)");
            if elsewhere {
                c.parse_with(runner.clone());
            }
            for piece in data.as_bytes().chunks(65_536) {
                c.push(piece).unwrap();
            }
            rows(c)
        };
        let here = load(&data, false).unwrap();
        assert_eq!(here.len(), 40_000);
        assert_eq!(load(&data, true).unwrap(), here);
        // A bad line deep in the data: the same error, with its line number.
        let bad = data.replacen("31234,", "x,", 1);
        let (e1, e2) = (
            load(&bad, false).unwrap_err(),
            load(&bad, true).unwrap_err(),
        );
        assert_eq!(format!("{e1:?}"), format!("{e2:?}"));
        assert!(format!("{e2:?}").contains("line 31235"), "{e2:?}");
        // `\.` early on: the bad lines after it do not count.
        let head: String = (0..20).map(line).collect();
        let ended = format!("{head}\\.\n{bad}");
        assert_eq!(load(&ended, true).unwrap(), load(&ended, false).unwrap());
        assert_eq!(load(&ended, true).unwrap().len(), 20);
    }

    fn copy_out(csv: bool, null: &str) -> eddy_planner::sql::CopyOut {
        eddy_planner::sql::CopyOut {
            query: String::new(),
            subscribe: false,
            csv,
            header: false,
            delimiter: if csv { ',' } else { '\t' },
            null: null.to_string(),
        }
    }

    fn columns(n: usize) -> Vec<crate::session::cells::Column> {
        (0..n)
            .map(|i| crate::session::cells::Column::text(format!("c{i}")))
            .collect()
    }

    /// Text and CSV lines are escaped and quoted as PostgreSQL's COPY TO writes them.
    #[test]
    fn copy_out_escapes_as_postgres() {
        use crate::session::cells::Cell;
        let row = vec![
            Cell::text("a\\b\tc\nd\re\u{8}f\u{c}g\u{b}h\u{1}"),
            Cell::Null,
            Cell::text(""),
            Cell::text("x,y\"z"),
        ];
        let mut text = CopyLines::new(&columns(4), &copy_out(false, "\\N"));
        assert_eq!(
            String::from_utf8(text.line(row.clone())).unwrap(),
            "a\\\\b\\tc\\nd\\re\\bf\\fg\\vh\u{1}\t\\N\t\tx,y\"z\n"
        );
        let mut csv = CopyLines::new(&columns(4), &copy_out(true, ""));
        assert_eq!(
            String::from_utf8(csv.line(row)).unwrap(),
            "\"a\\b\tc\nd\re\u{8}f\u{c}g\u{b}h\u{1}\",,\"\",\"x,y\"\"z\"\n"
        );
        // A value that reads as the NULL string is quoted; `\.` alone on a line too.
        let mut csv = CopyLines::new(&columns(2), &copy_out(true, "NA"));
        assert_eq!(
            csv.lines(&[vec![Cell::text("NA"), Cell::text("NAN")]]),
            b"\"NA\",NAN\n"
        );
        let mut single = CopyLines::new(&columns(1), &copy_out(true, ""));
        assert_eq!(single.lines(&[vec![Cell::text("\\.")]]), b"\"\\.\"\n");
    }

    /// A batch's lines are those of its cells, for the types written straight from the
    /// arrays and for those written through cells.
    #[test]
    fn batch_lines_are_the_cells_lines() {
        use datafusion::arrow::array::*;
        use std::sync::Arc;
        let batch = RecordBatch::try_from_iter(vec![
            (
                "b",
                Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])) as ArrayRef,
            ),
            (
                "i",
                Arc::new(Int32Array::from(vec![Some(-7), Some(0), None])),
            ),
            (
                "l",
                Arc::new(Int64Array::from(vec![Some(i64::MIN), None, Some(42)])),
            ),
            (
                "f",
                Arc::new(Float64Array::from(vec![Some(0.1 + 0.2), Some(1e20), None])),
            ),
            (
                "r",
                Arc::new(Float32Array::from(vec![Some(0.1), None, Some(1e-5)])),
            ),
            (
                "s",
                Arc::new(StringArray::from(vec![Some("a\tb"), None, Some("")])),
            ),
            (
                "v",
                Arc::new(StringViewArray::from(vec![None, Some("x\\y"), Some("z")])),
            ),
            (
                "t",
                Arc::new(TimestampMicrosecondArray::from(vec![
                    Some(1_700_000_000_123_400),
                    None,
                    Some(-1),
                ])),
            ),
            (
                "d",
                Arc::new(Date32Array::from(vec![Some(20_000), None, Some(0)])),
            ),
            (
                "n",
                Arc::new(
                    Decimal128Array::from(vec![Some(12_345), None, Some(-5)])
                        .with_precision_and_scale(10, 2)
                        .unwrap(),
                ),
            ),
        ])
        .unwrap();
        let cells = crate::session::cells::rows_of_batches(std::slice::from_ref(&batch));
        for (csv, null) in [(false, "\\N"), (true, "")] {
            let mut lines = CopyLines::new(&columns(10), &copy_out(csv, null));
            assert_eq!(lines.batch(&batch), lines.lines(&cells));
        }
    }
}

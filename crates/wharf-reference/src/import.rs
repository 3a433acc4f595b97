//! The import service: load rows into a dataset over several calls, through an import
//! handle, with idempotent appends; then query the dataset.
//!
//! Datasets are per principal, so callers never see each other's. An import is a handle
//! (`imp_…`) carrying its definition (dataset and columns); its staged rows go with it. The
//! data lives in the service's own tables or keys: see [`crate::data`].

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use wharf::store::TxMode;
use wharf::store::human;
use wharf::{
    ChangeEvent, Context, Elicited, FormSchema, Handle, HandleKind, HandlerError, ServerBuilder,
    Structured, template, tool,
};
use wharf_protocol::{ResourceContents, ToolAnnotations};

use crate::data::{Commit, Data, Staged};

/// The OAuth scope of the tools that read datasets (API keys are not limited by scopes).
pub const DATASETS_READ: &str = "datasets:read";
/// The OAuth scope of the tools that write datasets.
pub const DATASETS_WRITE: &str = "datasets:write";

/// Most rows one `import_append_rows` call takes.
pub const MAX_ROWS_PER_APPEND: usize = 1000;
/// Most rows an import may stage before it is committed.
pub const MAX_STAGED_ROWS: u64 = 1_000_000;
/// Largest row, in bytes of its JSON: scans and replies hold hundreds of rows at once, so
/// one tenant's huge rows would make the process hold gigabytes.
pub const MAX_ROW_BYTES: usize = 64 * 1024;
/// Most datasets one user may hold: a commit that would create one more is refused. (Two
/// commits creating datasets at once may both pass the check; the cap is off by at most the
/// calls in flight.)
pub const MAX_DATASETS: u64 = 1000;
/// Most imports one user may have open at once: beginning one more is refused.
pub const MAX_OPEN_IMPORTS: u64 = 100;
/// Most bytes of rows one user may store, staged and committed together (rows counted as
/// for [`MAX_ROW_BYTES`]): an append that would go beyond is refused. Appends running at
/// once for one user may both pass the check, off by at most the calls in flight.
pub const MAX_STORED_BYTES: u64 = 1 << 30;
/// Most filters in one `dataset_query`.
pub const MAX_FILTERS: usize = 32;
/// Most rows one `dataset_query` call returns.
pub const MAX_QUERY_LIMIT: u32 = 500;
/// Most rows one `dataset_query` call examines, so a selective filter over a large dataset
/// answers in bounded time (with a cursor to go on).
const MAX_SCAN_PER_QUERY: u32 = 20_000;
/// Most bytes of rows one `dataset_query` call examines, and returns: rows are bounded, but
/// hundreds of large rows would still make one reply megabytes long. A page ends at the row
/// that reaches the limit, with a cursor to go on.
const MAX_SCAN_BYTES: usize = 16 * 1024 * 1024;
/// Most bytes of rows one `dataset_query` page returns: it ends at the row that reaches
/// this, with a cursor to go on.
pub const MAX_REPLY_BYTES: usize = 1024 * 1024;
const SCAN_CHUNK: u32 = 500;

/// An import in progress.
pub struct Import;

impl HandleKind for Import {
    const KIND: &'static str = "import";
    const PREFIX: &'static str = "imp";
    const CREATED_BY: &'static str = "import_begin";
    const TTL: Duration = Duration::from_secs(24 * 3600);
    const IDLE_TTL: Option<Duration> = Some(Duration::from_secs(3600));
    const MAX_PER_OWNER: Option<u64> = Some(MAX_OPEN_IMPORTS);
}

/// The type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
/// What a column holds.
pub enum ColumnType {
    /// Text.
    String,
    /// Whole numbers.
    Integer,
    /// Any number.
    Number,
    /// `true` or `false`.
    Boolean,
}

impl ColumnType {
    fn accepts(self, v: &Value) -> bool {
        match self {
            ColumnType::String => v.is_string(),
            ColumnType::Integer => v.is_i64() || v.is_u64(),
            ColumnType::Number => v.is_number(),
            ColumnType::Boolean => v.is_boolean(),
        }
    }
}

/// A column of a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Column {
    /// Letters, digits and `_`, not starting with a digit; at most 64 characters.
    pub name: String,
    /// What the column holds.
    #[serde(rename = "type")]
    pub kind: ColumnType,
    /// Whether the column may be null or left out (default: false).
    #[serde(default)]
    pub nullable: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct BeginArgs {
    /// The dataset to load into: letters, digits, `_` and `-`, at most 64 characters.
    dataset: String,
    /// The dataset's columns. Required when the dataset does not exist yet; when it does,
    /// leave them out or give exactly its columns.
    #[serde(default)]
    columns: Option<Vec<Column>>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ImportInfo {
    /// The import handle to pass to the other import tools.
    import: String,
    dataset: String,
    columns: Vec<Column>,
    /// Rows appended so far, not yet committed.
    staged_rows: u64,
    /// When the import expires unless it is used again or committed (milliseconds since
    /// the Unix epoch): each use moves this on, up to the end of its lifetime.
    expires_at: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AppendArgs {
    import: Handle<Import>,
    /// Rows to append (at most 1000 per call): objects whose keys are the dataset's columns.
    rows: Vec<Map<String, Value>>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Appended {
    appended: u64,
    staged_rows: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ImportArgs {
    import: Handle<Import>,
}

/// How `import_commit` lands the rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum CommitMode {
    /// After the dataset's rows (the default).
    #[default]
    Append,
    /// Instead of the dataset's rows; the user is asked to confirm when it has any.
    Replace,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CommitArgs {
    import: Handle<Import>,
    /// `append` (default) or `replace`.
    #[serde(default)]
    mode: CommitMode,
}

/// The user's answer to "replace the dataset?".
#[derive(Debug, Deserialize)]
struct ReplaceAnswer {
    replace: bool,
}

const CONFIRM_REPLACE: &str = "confirm_replace";

/// The form that confirms replacing a dataset's rows.
fn replace_form() -> FormSchema {
    FormSchema::new().boolean("replace", "Replace the dataset's rows", true)
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Committed {
    dataset: String,
    committed_rows: u64,
    total_rows: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DeleteArgs {
    /// The dataset to delete.
    dataset: String,
}

/// The user's answer to "delete the dataset?".
#[derive(Debug, Deserialize)]
struct DeleteAnswer {
    delete: bool,
}

const CONFIRM_DELETE: &str = "confirm_delete";

/// What a confirmation showed its user of a dataset, kept in the round's state: the answer
/// holds only while the dataset is still that (the same making, as many rows). One made
/// again, or grown, since is asked about again.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Shown {
    generation: i64,
    rows: u64,
}

/// How a question about a dataset starts: plainly, or saying it changed since the user
/// was asked (`confirmed`, about another state of it).
fn changed_since(confirmed: bool) -> &'static str {
    if confirmed {
        "The dataset changed since you were asked. "
    } else {
        ""
    }
}

/// The form that confirms deleting a dataset.
fn delete_form() -> FormSchema {
    FormSchema::new().boolean("delete", "Delete the dataset", true)
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Deleted {
    dataset: String,
    deleted_rows: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Aborted {
    discarded_rows: u64,
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Op {
    Eq,
    Ne,
    Lt,
    Lte,
    Gt,
    Gte,
    /// Substring match on strings.
    Contains,
}

/// Keeps rows whose `column` compares to `value` with `op`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Filter {
    column: String,
    op: Op,
    value: Value,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct QueryArgs {
    dataset: String,
    /// Every filter must hold (AND); at most 32.
    #[serde(default)]
    #[schemars(length(max = 32))]
    filters: Vec<Filter>,
    /// Most rows to return, 1 to 500 (default 100).
    #[serde(default)]
    #[schemars(range(min = 1, max = 500))]
    limit: Option<u32>,
    /// `nextCursor` of the previous page, with the same dataset and filters.
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct QueryResult {
    rows: Vec<Value>,
    /// Present when there may be more rows: pass it back as `cursor`.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn valid_name(name: &str, extra: &[u8]) -> bool {
    (1..=64).contains(&name.len())
        && !name.as_bytes()[0].is_ascii_digit()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || extra.contains(&b))
}

pub(crate) fn check_dataset_name(name: &str) -> Result<(), HandlerError> {
    if valid_name(name, b"-") {
        Ok(())
    } else {
        Err(HandlerError::execution(format!(
            "Invalid dataset name {name:?}: use 1 to 64 letters, digits, '_' or '-', not starting with a digit."
        )))
    }
}

fn check_columns(columns: &[Column]) -> Result<(), HandlerError> {
    if columns.is_empty() || columns.len() > 100 {
        return Err(HandlerError::execution("A dataset needs 1 to 100 columns."));
    }
    for (i, c) in columns.iter().enumerate() {
        if !valid_name(&c.name, b"") {
            return Err(HandlerError::execution(format!(
                "Invalid column name {:?}: use 1 to 64 letters, digits or '_', not starting with a digit.",
                c.name
            )));
        }
        if columns[..i].iter().any(|o| o.name == c.name) {
            return Err(HandlerError::execution(format!(
                "Column {:?} is given twice.",
                c.name
            )));
        }
    }
    Ok(())
}

/// [`row_bytes`] of a stored row.
fn stored_row_bytes(row: &Value) -> usize {
    row.as_object().map_or(0, row_bytes)
}

/// What escaping adds to a string's JSON: a character for `"` and `\`, five for the other
/// control characters (`\u00XX`; a few have two-character escapes, counted as five too).
fn escapes(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' => 1,
            0..=0x1f => 5,
            _ => 0,
        })
        .sum()
}

/// The size of a row's JSON, close enough to cap it without writing it out (strings with
/// their escapes at most; numbers count as their longest; keys are column names, which
/// need none).
fn row_bytes(row: &Map<String, Value>) -> usize {
    row.iter()
        .map(|(k, v)| {
            k.len()
                + 4
                + match v {
                    Value::String(s) => s.len() + 2 + escapes(s),
                    Value::Number(_) => 24,
                    Value::Bool(_) => 5,
                    // Columns hold scalars; anything else was refused before.
                    _ => 4,
                }
        })
        .sum::<usize>()
        + 2
}

/// Checks one row against the columns, and returns its size ([`row_bytes`]); the message
/// names the row and the column.
fn check_row(index: usize, row: &Map<String, Value>, columns: &[Column]) -> Result<usize, String> {
    for key in row.keys() {
        if !columns.iter().any(|c| c.name == *key) {
            return Err(format!(
                "Row {index}: unknown column {key:?} (columns: {}).",
                columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    for c in columns {
        match row.get(&c.name) {
            None | Some(Value::Null) if c.nullable => {}
            None => return Err(format!("Row {index}: column {:?} is missing.", c.name)),
            Some(v) if !c.kind.accepts(v) => {
                return Err(format!(
                    "Row {index}: column {:?} must be {}, got {v}.",
                    c.name,
                    match c.kind {
                        ColumnType::String => "a string",
                        ColumnType::Integer => "an integer",
                        ColumnType::Number => "a number",
                        ColumnType::Boolean => "a boolean",
                    }
                ));
            }
            Some(_) => {}
        }
    }
    let bytes = row_bytes(row);
    if bytes > MAX_ROW_BYTES {
        return Err(format!(
            "Row {index}: {bytes} bytes; a row holds at most {MAX_ROW_BYTES} bytes (64 KiB). Nothing was appended."
        ));
    }
    Ok(bytes)
}

/// The columns and row count of an existing dataset of the caller's; a dataset that does not
/// exist is the caller's error.
pub(crate) async fn dataset_definition(
    data: &mut Data<'_>,
    cx: &Context,
    dataset: &str,
) -> Result<(Vec<Column>, u64), HandlerError> {
    match data.dataset(cx.principal().id(), dataset).await? {
        Some(d) => Ok((columns_of(&d.columns)?, d.rows)),
        None => Err(HandlerError::execution(format!(
            "Dataset {dataset:?} does not exist."
        ))),
    }
}

fn columns_of(columns: &Value) -> Result<Vec<Column>, HandlerError> {
    serde_json::from_value(columns.clone())
        .map_err(|e| HandlerError::internal(format!("stored columns are unreadable: {e}")))
}

/// The error of an import whose dataset was created meanwhile with other columns.
fn other_columns(dataset: &str, have: &[Column]) -> HandlerError {
    HandlerError::execution(format!(
        "Dataset {dataset:?} was created meanwhile with other columns ({}); this import's rows do not fit it. Abort this import and start again.",
        serde_json::to_string(have).unwrap_or_default()
    ))
}

/// What an import handle carries: its dataset and columns.
#[derive(Debug, Serialize, Deserialize)]
struct ImportDef {
    dataset: String,
    columns: Vec<Column>,
}

/// An import's definition, read with the handle's ownership check (no extra lookup).
fn import_meta(
    cx: &Context,
    import: &Handle<Import>,
) -> Result<(String, Vec<Column>), HandlerError> {
    let def: ImportDef = cx.handle_data(import)?;
    Ok((def.dataset, def.columns))
}

/// When an import expires if it is not used again: its idle limit from `used` (its last
/// recorded use), or its lifetime's end, whichever comes first. (A use is recorded at most
/// once in 1 % of the idle limit, so the import may in fact last up to that much longer.)
fn expires_unless_used(lifetime_end: i64, used: i64, idle_ms: Option<i64>) -> i64 {
    let idle = idle_ms.map_or(i64::MAX, |idle| used.saturating_add(idle));
    lifetime_end.min(idle)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn compare(op: Op, have: &Value, want: &Value) -> bool {
    use std::cmp::Ordering;
    let ord = match (have, want) {
        (Value::Number(a), Value::Number(b)) => a
            .as_f64()
            .zip(b.as_f64())
            .and_then(|(a, b)| a.partial_cmp(&b)),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        (Value::Null, Value::Null) => Some(Ordering::Equal),
        _ => None,
    };
    match op {
        Op::Eq => ord == Some(Ordering::Equal),
        Op::Ne => ord != Some(Ordering::Equal),
        Op::Lt => ord == Some(Ordering::Less),
        Op::Lte => matches!(ord, Some(Ordering::Less | Ordering::Equal)),
        Op::Gt => ord == Some(Ordering::Greater),
        Op::Gte => matches!(ord, Some(Ordering::Greater | Ordering::Equal)),
        Op::Contains => match (have, want) {
            (Value::String(a), Value::String(b)) => a.contains(b.as_str()),
            _ => false,
        },
    }
}

/// Registers the import service.
pub fn register(builder: ServerBuilder) -> ServerBuilder {
    let retention = format!(
        "An import lives {} from its creation and expires after {} without use; its staged rows go with it.",
        human(Import::TTL),
        human(Import::IDLE_TTL.unwrap_or(Import::TTL))
    );
    builder
        .tool(
            tool("import_begin")
                .scopes(&[DATASETS_WRITE])
                .idempotent()
                .description(format!(
                    "Start loading rows into a dataset (created on commit if it does not exist). Returns an import handle for import_append_rows, import_status, import_commit and import_abort; retried with the same idempotency_key, it returns the same import. A user has at most {MAX_OPEN_IMPORTS} imports open at once. {retention}"
                ))
                .handler(|cx: Context, args: BeginArgs| async move {
                    check_dataset_name(&args.dataset)?;
                    let existing = {
                        let mut tx = cx.tx().await?;
                        Data::of(tx.as_mut())?
                            .dataset(cx.principal().id(), &args.dataset)
                            .await?
                    };
                    let columns = match (existing, args.columns) {
                        (Some(d), None) => columns_of(&d.columns)?,
                        (Some(d), Some(given)) => {
                            let have = columns_of(&d.columns)?;
                            if have != given {
                                return Err(HandlerError::execution(format!(
                                    "Dataset {:?} exists with other columns: {}. Leave columns out to use them.",
                                    args.dataset,
                                    serde_json::to_string(&have).unwrap_or_default()
                                )));
                            }
                            have
                        }
                        (None, Some(given)) => {
                            check_columns(&given)?;
                            given
                        }
                        (None, None) => {
                            return Err(HandlerError::execution(format!(
                                "Dataset {:?} does not exist yet: give its columns.",
                                args.dataset
                            )));
                        }
                    };
                    let def = ImportDef { dataset: args.dataset, columns };
                    let data = serde_json::to_value(&def).map_err(HandlerError::internal)?;
                    let import = cx.mint_handle_with::<Import>(data).await?;
                    let ImportDef { dataset, columns } = def;
                    let now = wharf::store::now_millis();
                    let idle = Import::IDLE_TTL.map(millis);
                    let expires_at = expires_unless_used(now + millis(Import::TTL), now, idle);
                    Ok::<_, HandlerError>(Structured(ImportInfo {
                        import: import.id().to_owned(),
                        dataset,
                        columns,
                        staged_rows: 0,
                        expires_at,
                    }))
                }),
        )
        .tool(
            tool("import_append_rows")
                .scopes(&[DATASETS_WRITE])
                .mutates("import")
                .description(format!(
                    "Append rows to an import (at most {MAX_ROWS_PER_APPEND} per call, each at most {MAX_ROW_BYTES} bytes of JSON). Rows are checked against the dataset's columns; nothing is appended if one is wrong, or if the user's rows, staged and committed, would pass {} GiB. Retry with the same idempotency_key after an error or a lost answer: the rows are appended once.",
                    MAX_STORED_BYTES >> 30
                ))
                .idempotent()
                .handler(|cx: Context, args: AppendArgs| async move {
                    if args.rows.len() > MAX_ROWS_PER_APPEND {
                        return Err(HandlerError::execution(format!(
                            "{} rows given; send at most {MAX_ROWS_PER_APPEND} per call.",
                            args.rows.len()
                        )));
                    }
                    let (_, columns) = import_meta(&cx, &args.import)?;
                    let mut adding = 0u64;
                    for (i, row) in args.rows.iter().enumerate() {
                        adding += check_row(i, row, &columns).map_err(HandlerError::Execution)? as u64;
                    }
                    // The staged rows expire with the import (its record is there: it was
                    // checked for this call).
                    let record = cx
                        .handle_record(&args.import)
                        .ok_or_else(|| HandlerError::internal("the import's record was not loaded"))?;
                    let appended = {
                        let mut tx = cx.tx().await?;
                        Data::of(tx.as_mut())?
                            .append_staged(record, &args.rows, adding, MAX_STORED_BYTES)
                            .await?
                    };
                    let staged = match appended {
                        Staged::Rows(staged) => staged,
                        Staged::OverQuota { stored } => {
                            return Err(HandlerError::execution(format!(
                                "Nothing was appended: you store {stored} bytes of rows (committed and staged), and these rows add {adding}; one user may store at most {MAX_STORED_BYTES} bytes ({} GiB). Delete a dataset (dataset_delete) or abort an import (import_abort) first; an import that expired uncommitted counts until it is swept, up to an hour after it expired.",
                                MAX_STORED_BYTES >> 30
                            )));
                        }
                    };
                    if staged > MAX_STAGED_ROWS {
                        return Err(HandlerError::execution(format!(
                            "An import holds at most {MAX_STAGED_ROWS} rows before it is committed; this call would bring it to {staged}. Commit it and start another."
                        )));
                    }
                    Ok::<_, HandlerError>(Structured(Appended {
                        appended: args.rows.len() as u64,
                        staged_rows: staged,
                    }))
                }),
        )
        .tool(
            tool("import_status")
                .scopes(&[DATASETS_READ])
                .description("What an import holds: its dataset, columns and staged rows.")
                .annotations(ToolAnnotations {
                    read_only_hint: Some(true),
                    ..Default::default()
                })
                .handler(|cx: Context, args: ImportArgs| async move {
                    let (dataset, columns) = import_meta(&cx, &args.import)?;
                    // A read: on SQLite a write transaction would queue every status poll
                    // behind the one writer.
                    let staged = {
                        let mut tx = cx.transaction(TxMode::Read).await?;
                        Data::of(tx.as_mut())?.staged(args.import.id()).await?
                    };
                    let expires_at = cx
                        .handle_record(&args.import)
                        .map_or(0, |r| {
                            expires_unless_used(r.expires_at, r.last_used_at, r.idle_ms)
                        });
                    Ok::<_, HandlerError>(Structured(ImportInfo {
                        import: args.import.id().to_owned(),
                        dataset,
                        columns,
                        staged_rows: staged,
                        expires_at,
                    }))
                }),
        )
        .tool(
            tool("import_commit")
                .scopes(&[DATASETS_WRITE])
                .mutates("import")
                .idempotent()
                .description("Move an import's staged rows into its dataset, all at once, and close the import. With mode \"replace\" the dataset's rows are replaced; when it has any, the user is asked to confirm first (elicitation). Retried with the same idempotency_key (an answer lost), it returns what the first commit did, even though the import is closed: never commit the rows again through a new import.")
                .handler(|cx: Context, args: CommitArgs| async move {
                    let (dataset, columns) = import_meta(&cx, &args.import)?;
                    // An answer to "replace?" is read, and its state redeemed once, in the
                    // call's transaction: the redemption commits with the commit.
                    let confirmed = match cx.elicited::<ReplaceAnswer>(CONFIRM_REPLACE, &replace_form()) {
                        Some(Elicited::Accepted(ReplaceAnswer { replace: true })) => {
                            cx.redeem_once().await?;
                            true
                        }
                        Some(_) => {
                            return Err(HandlerError::execution(format!(
                                "Not committed: replacing the rows of dataset {dataset:?} was not confirmed. The import is still open: commit it with mode \"append\", or abort it."
                            )));
                        }
                        None => false,
                    };
                    let mut tx = cx.tx().await?;
                    // Lock the import for good first (a recorded use takes the row): appends
                    // still running finish before it, later ones find it gone.
                    tx.hold_handle(args.import.id(), Some(wharf::store::now_millis()))
                        .await?;
                    let owner = cx.principal().id();
                    let import = args.import.id();
                    let mut data = Data::of(tx.as_mut())?;
                    let existing = data.dataset_to_change(owner, &dataset).await?;
                    if let Some(there) = &existing {
                        // Created meanwhile by another import, with other columns: these
                        // rows do not fit it.
                        let have = columns_of(&there.columns)?;
                        if have != columns {
                            return Err(other_columns(&dataset, &have));
                        }
                    } else {
                        let held = data.dataset_count(owner).await?;
                        if held >= MAX_DATASETS {
                            return Err(HandlerError::execution(format!(
                                "Not committed: you hold {held} datasets, the most one user may ({MAX_DATASETS}). Delete one with dataset_delete, or commit into an existing dataset; the import is still open."
                            )));
                        }
                    }
                    let replace = args.mode == CommitMode::Replace;
                    let shown = existing.as_ref().map(|d| Shown { generation: d.generation, rows: d.rows });
                    let seen = existing;
                    let existing = seen.as_ref().map_or(0, |d| d.rows);
                    let still = shown.is_some() && cx.round_state::<Shown>() == shown;
                    if replace && existing > 0 && !(confirmed && still) {
                        let staged = data.staged(import).await?;
                        drop(tx);
                        let again = changed_since(confirmed);
                        return Err(cx
                            .ask()
                            .elicit(
                                CONFIRM_REPLACE,
                                format!("{again}Replace the {existing} rows of dataset {dataset:?} with the {staged} rows of this import?"),
                                replace_form(),
                            )
                            .state(&shown)
                            .into());
                    }
                    let columns_json = serde_json::to_value(&columns).map_err(HandlerError::internal)?;
                    let (moved, total) = match data
                        .commit_staged(owner, &dataset, &columns_json, import, replace, seen.as_ref())
                        .await?
                    {
                        Commit::Done { moved, total } => (moved, total),
                        Commit::OtherColumns(have) => {
                            return Err(other_columns(&dataset, &columns_of(&have)?));
                        }
                        Commit::Changed => {
                            return Err(HandlerError::execution(format!(
                                "Not committed: another import made dataset {dataset:?} while this one committed. Commit again to be asked about replacing its rows; the import is still open."
                            )));
                        }
                    };
                    tx.retire_handle(import).await?;
                    drop(tx);
                    cx.announce_on_commit(dataset_changed(owner, &dataset)).await;
                    Ok::<_, HandlerError>(Structured(Committed {
                        dataset,
                        committed_rows: moved,
                        total_rows: total,
                    }))
                }),
        )
        .tool(
            tool("import_abort")
                .scopes(&[DATASETS_WRITE])
                .mutates("import")
                .idempotent()
                .description("Discard an import and its staged rows. Retried with the same idempotency_key, it answers what the first abort did, even though the import is gone.")
                .annotations(ToolAnnotations {
                    destructive_hint: Some(true),
                    ..Default::default()
                })
                .handler(|cx: Context, args: ImportArgs| async move {
                    let mut tx = cx.tx().await?;
                    tx.hold_handle(args.import.id(), Some(wharf::store::now_millis()))
                        .await?;
                    let staged = Data::of(tx.as_mut())?
                        .discard_staged(cx.principal().id(), args.import.id())
                        .await?;
                    tx.retire_handle(args.import.id()).await?;
                    Ok::<_, HandlerError>(Structured(Aborted {
                        discarded_rows: staged,
                    }))
                }),
        )
        .tool(
            tool("dataset_delete")
                .scopes(&[DATASETS_WRITE])
                .idempotent()
                .description("Delete a dataset and its rows, after the user confirms (elicitation). A confirmation answers this one deletion only: it cannot be used again. Retried with the same idempotency_key (an answer lost), the confirmed deletion answers what it did, and deletes nothing more.")
                .annotations(ToolAnnotations {
                    destructive_hint: Some(true),
                    ..Default::default()
                })
                .mutates("dataset")
                .handler(|cx: Context, args: DeleteArgs| async move { delete(&cx, args).await }),
        )
        .tool(
            tool("dataset_query")
                .scopes(&[DATASETS_READ])
                .description(format!(
                    "Read a dataset's rows in order, optionally filtered; page with nextCursor. A page holds at most limit rows (100 unless given, at most {MAX_QUERY_LIMIT}) and ends early once it holds {} KiB of rows.",
                    MAX_REPLY_BYTES / 1024
                ))
                .annotations(ToolAnnotations {
                    read_only_hint: Some(true),
                    ..Default::default()
                })
                .handler(|cx: Context, args: QueryArgs| async move { query(&cx, args).await }),
        )
        .template(
            template("dataset://{name}", "dataset")
                .scopes(&[DATASETS_READ])
                .description("A dataset: its columns, its row count and its first rows.")
                .mime_type("application/json")
                .handler(|cx, req| async move {
                    let name = req.vars.get("name").cloned().unwrap_or_default();
                    let mut tx = cx.store()?.begin(TxMode::Read).await?;
                    let mut data = Data::of(tx.as_mut())?;
                    let owner = cx.principal().id();
                    let Some(def) = data.dataset(owner, &name).await? else {
                        return Err(wharf::RpcError::resource_not_found(&req.uri).into());
                    };
                    let sample: Vec<Value> = data
                        .scan(owner, &name, None, 20)
                        .await?
                        .into_iter()
                        .map(|(_, v)| v)
                        .collect();
                    let body = json!({
                        "name": name,
                        "columns": def.columns,
                        "rowCount": def.rows,
                        "firstRows": sample,
                    });
                    Ok(vec![ResourceContents::text(req.uri, "application/json", body.to_string())])
                }),
        )
}

/// `resources/updated` for `dataset://NAME`, to its owner's listen streams only (another
/// principal's dataset of the same name is another resource).
fn dataset_changed(owner: &str, name: &str) -> ChangeEvent {
    ChangeEvent::PrivateResourceUpdated {
        uri: format!("dataset://{name}"),
        principal: owner.to_owned(),
    }
}

async fn delete(cx: &Context, args: DeleteArgs) -> Result<Structured<Deleted>, HandlerError> {
    check_dataset_name(&args.dataset)?;
    let confirmed = match cx.elicited::<DeleteAnswer>(CONFIRM_DELETE, &delete_form()) {
        Some(Elicited::Accepted(DeleteAnswer { delete: true })) => {
            // Before anything is deleted, in the call's transaction: a confirmation used
            // again must never delete a dataset created since.
            cx.redeem_once().await?;
            true
        }
        Some(_) => {
            return Err(HandlerError::execution(format!(
                "Not deleted: the user did not confirm deleting dataset {:?}.",
                args.dataset
            )));
        }
        None => false,
    };
    let owner = cx.principal().id();
    let mut tx = cx.tx().await?;
    let mut data = Data::of(tx.as_mut())?;
    let Some(dataset) = data.dataset_to_change(owner, &args.dataset).await? else {
        return Err(HandlerError::execution(format!(
            "Dataset {:?} does not exist.",
            args.dataset
        )));
    };
    let rows = dataset.rows;
    let shown = Shown {
        generation: dataset.generation,
        rows,
    };
    if !confirmed || cx.round_state::<Shown>().as_ref() != Some(&shown) {
        drop(tx);
        let again = changed_since(confirmed);
        return Err(cx
            .ask()
            .elicit(
                CONFIRM_DELETE,
                format!(
                    "{again}Delete dataset {:?} and its {rows} rows?",
                    args.dataset
                ),
                delete_form(),
            )
            .state(&shown)
            .into());
    }
    let deleted = data.delete_dataset(owner, dataset, &args.dataset).await?;
    cx.announce_on_commit(dataset_changed(owner, &args.dataset))
        .await;
    Ok(Structured(Deleted {
        dataset: args.dataset,
        deleted_rows: deleted,
    }))
}

async fn query(cx: &Context, args: QueryArgs) -> Result<Structured<QueryResult>, HandlerError> {
    check_dataset_name(&args.dataset)?;
    if args.filters.len() > MAX_FILTERS {
        return Err(HandlerError::execution(format!(
            "At most {MAX_FILTERS} filters per query."
        )));
    }
    let limit = args.limit.unwrap_or(100).clamp(1, MAX_QUERY_LIMIT);
    let store = cx.store()?;
    let mut tx = store.begin(TxMode::Read).await?;
    let mut data = Data::of(tx.as_mut())?;
    let Some(dataset) = data.dataset(cx.principal().id(), &args.dataset).await? else {
        return Err(HandlerError::execution(format!(
            "Dataset {:?} does not exist.",
            args.dataset
        )));
    };
    let columns = columns_of(&dataset.columns)?;
    for f in &args.filters {
        if !columns.iter().any(|c| c.name == f.column) {
            return Err(HandlerError::execution(format!(
                "Filter on unknown column {:?}.",
                f.column
            )));
        }
    }
    // The cursor is bound to the dataset (this making of it: one deleted and made again
    // numbers its rows from the start) and the filters: it cannot resume another query. A
    // dataset made before generations were kept (0) scopes its cursors as it did then, so
    // cursors handed out before an upgrade still resume.
    let mut scope = json!({
        "dataset": args.dataset,
        "filters": args.filters.iter().map(|f| json!([f.column, format!("{:?}", f.op), f.value])).collect::<Vec<_>>(),
    });
    if dataset.generation != 0 {
        scope["generation"] = json!(dataset.generation);
    }
    let scope = serde_json::to_vec(&scope).map_err(HandlerError::internal)?;
    let mut after = match &args.cursor {
        Some(c) => Some(i64::try_from(cx.resume(c, &scope)?).unwrap_or(i64::MAX)),
        None => None,
    };
    let owner = cx.principal().id();
    let mut rows = Vec::new();
    let (mut scanned, mut scanned_bytes, mut reply_bytes) = (0, 0, 0);
    let mut exhausted = false;
    'scan: while scanned < MAX_SCAN_PER_QUERY {
        let chunk = data.scan(owner, &args.dataset, after, SCAN_CHUNK).await?;
        let len = chunk.len() as u32;
        for (seq, row) in chunk {
            scanned += 1;
            after = Some(seq);
            let size = stored_row_bytes(&row);
            scanned_bytes += size;
            let keep = args
                .filters
                .iter()
                .all(|f| compare(f.op, row.get(&f.column).unwrap_or(&Value::Null), &f.value));
            if keep {
                rows.push(row);
                reply_bytes += size;
                if rows.len() as u32 == limit || reply_bytes >= MAX_REPLY_BYTES {
                    break 'scan;
                }
            }
            if scanned_bytes >= MAX_SCAN_BYTES {
                break 'scan;
            }
        }
        if len < SCAN_CHUNK {
            exhausted = true;
            break;
        }
    }
    // The chunks are read one after another (on PostgreSQL and Redis each sees what is
    // committed by then): a dataset deleted and made again meanwhile would have put its
    // rows, numbered from the start, behind the old ones' positions.
    let now = data.dataset(owner, &args.dataset).await?;
    if now.map(|d| d.generation) != Some(dataset.generation) {
        return Err(HandlerError::execution(format!(
            "Dataset {:?} was deleted while this page was read; query it again from the start.",
            args.dataset
        )));
    }
    let next_cursor = match (exhausted, after) {
        (false, Some(seq)) => Some(cx.cursor(u64::try_from(seq).unwrap_or(0), &scope)),
        _ => None,
    };
    Ok(Structured(QueryResult { rows, next_cursor }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Vec<Column> {
        vec![
            Column {
                name: "id".into(),
                kind: ColumnType::Integer,
                nullable: false,
            },
            Column {
                name: "name".into(),
                kind: ColumnType::String,
                nullable: true,
            },
        ]
    }

    fn row(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("test rows are objects"),
        }
    }

    #[test]
    fn rows_are_checked_against_columns_with_precise_messages() {
        // Accepted rows come back with the size they count as: keys and strings as
        // written, every number at its longest.
        assert_eq!(
            check_row(0, &row(json!({"id": 1, "name": "a"})), &cols()),
            Ok(2 + (2 + 4 + 24) + (4 + 4 + 1 + 2))
        );
        assert_eq!(
            check_row(0, &row(json!({"id": 1})), &cols()),
            Ok(2 + 2 + 4 + 24)
        );
        // Escapes count: `\u0001` is six characters in JSON, `\"` and `\\` two each.
        assert_eq!(
            check_row(0, &row(json!({"id": 1, "name": "\u{1}\"\\"})), &cols()),
            Ok(2 + (2 + 4 + 24) + (4 + 4 + (3 + 2 + 5 + 1 + 1)))
        );
        assert!(
            check_row(3, &row(json!({"name": "a"})), &cols())
                .unwrap_err()
                .contains("Row 3: column \"id\" is missing")
        );
        assert!(
            check_row(0, &row(json!({"id": 1.5})), &cols())
                .unwrap_err()
                .contains("must be an integer")
        );
        assert!(
            check_row(0, &row(json!({"id": 1, "x": 2})), &cols())
                .unwrap_err()
                .contains("unknown column \"x\"")
        );
    }

    #[test]
    fn filters_compare_like_types_only() {
        assert!(compare(Op::Gt, &json!(3), &json!(2.5)));
        assert!(compare(Op::Contains, &json!("harbour"), &json!("bou")));
        assert!(!compare(Op::Lt, &json!("1"), &json!(2)));
        assert!(compare(Op::Ne, &json!("1"), &json!(1)));
    }
}

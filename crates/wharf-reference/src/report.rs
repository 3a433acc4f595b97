//! Reports over a dataset: `report_generate` scans it in chunks, streams progress, records
//! how far it got as it goes, and stops the moment its request is cancelled;
//! `report_status` reads what was recorded.
//!
//! The latest report of each dataset is kept per principal (see [`crate::data`]). A run
//! cancelled before it finished is marked so by its cleanup, for that run only: the mark
//! can never touch a later run's report.

use std::time::Duration;

use crate::data::Data;
use crate::import::{
    Column, ColumnType, DATASETS_READ, DATASETS_WRITE, check_dataset_name, dataset_definition,
};
use async_stream::stream;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use wharf::store::{Millis, Store, TxMode, now_millis};
use wharf::{Context, HandlerError, ServerBuilder, Step, Structured, tool};
use wharf_protocol::ToolAnnotations;

/// Rows read per chunk unless told otherwise.
const DEFAULT_CHUNK: u32 = 1000;
/// Rows read from the store at once: a chunk (up to 5,000 rows) is read in slices of this
/// many, so a run holds at most this many rows in memory (at most 64 KiB each), whatever
/// chunk the caller asked for.
const SCAN_SLICE: u32 = 500;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GenerateArgs {
    /// The dataset to report on.
    dataset: String,
    /// Rows read per chunk, 100 to 5000 (default 1000); progress is reported per chunk.
    #[serde(default)]
    #[schemars(range(min = 100, max = 5000))]
    chunk_rows: Option<u32>,
    /// Milliseconds to pause between chunks, 0 to 1000 (default 0), to spare a busy database.
    #[serde(default)]
    #[schemars(range(max = 1000))]
    pause_ms: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StatusArgs {
    /// The dataset whose latest report to read.
    dataset: String,
}

/// Statistics of one column.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ColumnStats {
    name: String,
    /// Rows where the column is present and not null.
    non_null: u64,
    /// Numeric columns: the smallest value.
    #[serde(skip_serializing_if = "Option::is_none")]
    min: Option<f64>,
    /// Numeric columns: the largest value.
    #[serde(skip_serializing_if = "Option::is_none")]
    max: Option<f64>,
    /// Numeric columns: the mean.
    #[serde(skip_serializing_if = "Option::is_none")]
    mean: Option<f64>,
}

/// Where a report stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum State {
    Running,
    Done,
    /// The run stopped before it finished: the request that generated it was cancelled
    /// (the client went away or cancelled) or failed (the store, say).
    Cancelled,
}

/// A dataset's latest report, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Report {
    dataset: String,
    state: State,
    /// Which run of `report_generate` on this dataset this is (1 for the first).
    run: u64,
    scanned_rows: u64,
    total_rows: u64,
    /// Milliseconds since the Unix epoch.
    started_at: Millis,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<Millis>,
    /// When done: per-column statistics.
    #[serde(skip_serializing_if = "Option::is_none")]
    columns: Option<Vec<ColumnStats>>,
}

/// A column's running totals.
struct Totals {
    column: Column,
    non_null: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Totals {
    fn new(column: Column) -> Self {
        Totals {
            column,
            non_null: 0,
            sum: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    fn add(&mut self, value: Option<&Value>) {
        let Some(value) = value.filter(|v| !v.is_null()) else {
            return;
        };
        self.non_null += 1;
        if let Some(x) = value.as_f64() {
            self.sum += x;
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
    }

    fn stats(&self) -> ColumnStats {
        let numeric = matches!(self.column.kind, ColumnType::Integer | ColumnType::Number)
            && self.non_null > 0;
        ColumnStats {
            name: self.column.name.clone(),
            non_null: self.non_null,
            min: numeric.then_some(self.min),
            max: numeric.then_some(self.max),
            #[allow(clippy::cast_precision_loss)]
            mean: numeric.then(|| self.sum / self.non_null as f64),
        }
    }
}

/// Orders a run's progress commits before its cancellation mark: the cleanup registered
/// with `cx.on_cancel` marks the run cancelled only after a progress commit in flight at the
/// cancellation has landed (see [`Committing::commit`]), so a run seen cancelled is not
/// written to any more. It holds whether the run's start landed (the run is recorded).
#[derive(Default, Clone)]
struct Committing(std::sync::Arc<tokio::sync::Mutex<bool>>);

impl Committing {
    /// Commits `tx` on its own task: a commit the cancellation would cut short may still
    /// land in the store, and the cancellation mark must come after it.
    async fn commit(&self, tx: Box<dyn wharf::store::Transaction>) -> Result<(), HandlerError> {
        let mut turn = std::sync::Arc::clone(&self.0).lock_owned().await;
        tokio::spawn(async move {
            let landed = tx.commit().await;
            // The run is recorded once one of its commits (the first records it) landed.
            *turn |= landed.is_ok();
            drop(turn);
            landed
        })
        .await
        .map_err(HandlerError::internal)?
        .map_err(HandlerError::from)
    }

    /// The cleanup of a cancelled run: the mark, once no progress commit is in flight.
    async fn mark_cancelled(
        self,
        store: std::sync::Arc<dyn Store>,
        owner: String,
        dataset: String,
        run: u64,
    ) {
        let recorded = self.0.lock().await;
        // Cut short before its start landed, the run was never recorded: a mark would
        // name the number the next run takes.
        if !*recorded {
            return;
        }
        let marked = async {
            let mut tx = store.begin(TxMode::Write).await?;
            Data::of(tx.as_mut())?
                .mark_cancelled(&owner, &dataset, run)
                .await?;
            tx.commit().await.map_err(HandlerError::from)
        };
        if let Err(e) = marked.await {
            tracing::warn!(error = %e, "could not mark a cancelled report");
        }
    }
}

/// One run of `report_generate`.
struct Run {
    report: Report,
    totals: Vec<Totals>,
    after: Option<i64>,
    chunk: u32,
    committing: Committing,
}

impl Run {
    /// Reads the dataset's definition and size and records the run as started.
    async fn start(cx: &Context, args: &GenerateArgs) -> Result<Run, HandlerError> {
        check_dataset_name(&args.dataset)?;
        let owner = cx.principal().id();
        let mut tx = cx.transaction(TxMode::Write).await?;
        let mut data = Data::of(tx.as_mut())?;
        let (columns, total_rows) = dataset_definition(&mut data, cx, &args.dataset).await?;
        let previous = data
            .report(owner, &args.dataset)
            .await?
            .and_then(|(d, _)| serde_json::from_value::<Report>(d).ok());
        let run = previous.as_ref().map_or(0, |p| p.run) + 1;
        let report = Report {
            dataset: args.dataset.clone(),
            state: State::Running,
            run,
            scanned_rows: 0,
            total_rows,
            started_at: now_millis(),
            finished_at: None,
            columns: None,
        };
        put_report(&mut data, cx, &report).await?;
        // The cleanup is registered before the run is recorded, whose commit goes through
        // `committing`: cancelled while that commit lands, the run is marked after it
        // rather than left running.
        let committing = Committing::default();
        cx.on_cancel(committing.clone().mark_cancelled(
            cx.store()?.clone(),
            owner.to_owned(),
            args.dataset.clone(),
            run,
        ));
        committing.commit(tx).await?;
        Ok(Run {
            committing,
            totals: columns.into_iter().map(Totals::new).collect(),
            report,
            after: None,
            chunk: args.chunk_rows.unwrap_or(DEFAULT_CHUNK).clamp(100, 5000),
        })
    }

    /// Scans the next chunk and records how far the run got; `false` once every row is read.
    async fn next_chunk(&mut self, cx: &Context) -> Result<bool, HandlerError> {
        let mut read_rows = 0u32;
        {
            let mut read = cx.transaction(TxMode::Read).await?;
            let mut data = Data::of(read.as_mut())?;
            while read_rows < self.chunk {
                let want = (self.chunk - read_rows).min(SCAN_SLICE);
                let slice = data
                    .scan(cx.principal().id(), &self.report.dataset, self.after, want)
                    .await?;
                let got = slice.len() as u32;
                for (seq, row) in &slice {
                    for t in &mut self.totals {
                        t.add(row.get(&t.column.name));
                    }
                    self.after = Some(*seq);
                }
                read_rows += got;
                if got < want {
                    break;
                }
            }
        }
        if read_rows == 0 {
            return Ok(false);
        }
        self.report.scanned_rows += u64::from(read_rows);
        // Rows appended since the start are read too: the total follows.
        self.report.total_rows = self.report.total_rows.max(self.report.scanned_rows);
        let mut tx = cx.transaction(TxMode::Write).await?;
        put_report(&mut Data::of(tx.as_mut())?, cx, &self.report).await?;
        self.committing.commit(tx).await?;
        Ok(read_rows == self.chunk)
    }

    /// Marks the run stopped (as a cancellation does) after `e` ended it, so that it does
    /// not read as running for good; returns `e`.
    async fn failed(&self, cx: &Context, e: HandlerError) -> HandlerError {
        if let Ok(store) = cx.store() {
            let owner = cx.principal().id().to_owned();
            let (dataset, run) = (self.report.dataset.clone(), self.report.run);
            let stop = self.committing.clone();
            stop.mark_cancelled(std::sync::Arc::clone(store), owner, dataset, run)
                .await;
        }
        e
    }

    /// Records the finished report and returns it.
    async fn finish(&mut self, cx: &Context) -> Result<Structured<Report>, HandlerError> {
        self.report.state = State::Done;
        self.report.total_rows = self.report.scanned_rows;
        self.report.finished_at = Some(now_millis());
        self.report.columns = Some(self.totals.iter().map(Totals::stats).collect());
        let mut tx = cx.transaction(TxMode::Write).await?;
        put_report(&mut Data::of(tx.as_mut())?, cx, &self.report).await?;
        tx.commit().await?;
        Ok(Structured(self.report.clone()))
    }

    fn progress(&self) -> Step<Result<Structured<Report>, HandlerError>> {
        #[allow(clippy::cast_precision_loss)]
        Step::progress_with(
            self.report.scanned_rows as f64,
            Some(self.report.total_rows as f64),
            format!(
                "Scanned {} of {} rows of {}",
                self.report.scanned_rows, self.report.total_rows, self.report.dataset
            ),
        )
    }
}

async fn put_report(
    data: &mut Data<'_>,
    cx: &Context,
    report: &Report,
) -> Result<(), HandlerError> {
    let doc = serde_json::to_value(report).map_err(HandlerError::internal)?;
    data.put_report(cx.principal().id(), &report.dataset, report.run, &doc)
        .await
}

/// Registers `report_generate` and `report_status`.
pub fn register(builder: ServerBuilder) -> ServerBuilder {
    builder
        .tool(
            tool("report_generate")
                .scopes(&[DATASETS_WRITE])
                .description(
                    "Compute per-column statistics of a dataset (non-null counts; min, max and mean of numeric columns), scanning it in chunks with progress. Runs one at a time per dataset; cancelling the request stops the scan. report_status reads the result later. Retried with the same idempotency_key, it returns the report that call produced (waiting for it while it runs) instead of starting another; a run cut short before it finished is started again.",
                )
                .mutates("dataset")
                // The run records how far it got as it goes, in commits of its own.
                .idempotent_in_steps()
                .stream_handler(|cx: Context, args: GenerateArgs| {
                    stream! {
                        let mut run = match Run::start(&cx, &args).await {
                            Ok(run) => run,
                            Err(e) => {
                                yield Step::Done(Err(e));
                                return;
                            }
                        };
                        yield run.progress();
                        let pause = Duration::from_millis(args.pause_ms.unwrap_or(0).min(1000).into());
                        loop {
                            match run.next_chunk(&cx).await {
                                Ok(more) => {
                                    yield run.progress();
                                    if !more {
                                        break;
                                    }
                                }
                                Err(e) => {
                                    yield Step::Done(Err(run.failed(&cx, e).await));
                                    return;
                                }
                            }
                            if !pause.is_zero() {
                                tokio::time::sleep(pause).await;
                            }
                        }
                        match run.finish(&cx).await {
                            Ok(report) => yield Step::Done(Ok(report)),
                            Err(e) => yield Step::Done(Err(run.failed(&cx, e).await)),
                        }
                    }
                }),
        )
        .tool(
            tool("report_status")
                .scopes(&[DATASETS_READ])
                .description("The latest report of a dataset: running (with how far it got), done (with its statistics) or cancelled (stopped before it finished: cancelled, or failed).")
                .annotations(ToolAnnotations {
                    read_only_hint: Some(true),
                    ..Default::default()
                })
                .handler(|cx: Context, args: StatusArgs| async move {
                    check_dataset_name(&args.dataset)?;
                    let mut tx = cx.transaction(TxMode::Read).await?;
                    let Some((doc, cancelled)) = Data::of(tx.as_mut())?
                        .report(cx.principal().id(), &args.dataset)
                        .await?
                    else {
                        return Err(HandlerError::execution(format!(
                            "Dataset {:?} has no report yet: run report_generate.",
                            args.dataset
                        )));
                    };
                    let mut report: Report = serde_json::from_value(doc).map_err(|e| {
                        HandlerError::internal(format!("stored report is unreadable: {e}"))
                    })?;
                    if report.state == State::Running && cancelled {
                        report.state = State::Cancelled;
                    }
                    Ok::<_, HandlerError>(Structured(report))
                }),
        )
}

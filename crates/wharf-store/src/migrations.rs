//! An app's own SQL schema, applied by the store when it opens.
//!
//! The app's migrations and the store's share sqlx's `_sqlx_migrations` table, so their
//! version numbers must not meet: the store numbers its own below [`AppMigrations::MIN_VERSION`],
//! and an app numbers its migrations the way `sqlx migrate add` does by default, by timestamp
//! (`20261130120000_orders.sql`). Each side ignores the other's rows in that table.

use sqlx::migrate::Migrator;
use wharf::store::StoreError;

use crate::Dialect;

/// The migrations of an app's own tables, per SQL database; build them with
/// `sqlx::migrate!("./migrations/sqlite")` and so on. A store of a dialect without migrations
/// here applies none of the app's.
///
/// ```no_run
/// # async fn run() -> Result<(), wharf_store::OpenError> {
/// use std::sync::Arc;
/// let mut options = wharf_store::StoreOptions::default();
/// options.app_migrations = Some(Arc::new(
///     wharf_store::AppMigrations::new()
///         .sqlite(sqlx::migrate!("./migrations/sqlite"))
///         .postgres(sqlx::migrate!("./migrations/postgres")),
/// ));
/// let store = wharf_store::open("sqlite://./app.db", &options).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct AppMigrations {
    sqlite: Option<Migrator>,
    postgres: Option<Migrator>,
}

impl AppMigrations {
    /// The lowest version an app's migration may have; the store's own are below it.
    pub const MIN_VERSION: i64 = 10_000;

    /// No migrations yet.
    pub fn new() -> Self {
        AppMigrations::default()
    }

    /// The migrations applied to SQLite stores.
    pub fn sqlite(mut self, migrator: Migrator) -> Self {
        self.sqlite = Some(tolerant(migrator));
        self
    }

    /// The migrations applied to PostgreSQL stores.
    pub fn postgres(mut self, migrator: Migrator) -> Self {
        self.postgres = Some(tolerant(migrator));
        self
    }

    /// The migrator for `dialect`, refused when one of its versions is in the store's range.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn for_dialect(&self, dialect: Dialect) -> Result<Option<&Migrator>, StoreError> {
        let migrator = match dialect {
            Dialect::Sqlite => self.sqlite.as_ref(),
            Dialect::Postgres => self.postgres.as_ref(),
        };
        if let Some(m) = migrator.and_then(|m| m.iter().find(|m| m.version < Self::MIN_VERSION)) {
            return Err(StoreError::Backend(format!(
                "app migration {} ({}) is numbered in the store's own range: number app migrations from {} on (sqlx migrate add numbers them by timestamp)",
                m.version,
                m.description,
                Self::MIN_VERSION
            )));
        }
        Ok(migrator)
    }
}

/// A migrator that leaves alone the versions it does not know (the other side's).
pub(crate) fn tolerant(mut migrator: Migrator) -> Migrator {
    migrator.set_ignore_missing(true);
    migrator
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[test]
    fn app_migrations_numbered_like_the_stores_are_refused_by_name() {
        // The store's own migrations, passed off as an app's: versions 1, 2, ….
        let app = AppMigrations::new().sqlite(sqlx::migrate!("./migrations/sqlite"));
        let err = app
            .for_dialect(Dialect::Sqlite)
            .err()
            .map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.contains("app migration 1 (wharf core)"), "{err}");
        assert!(err.contains("from 10000 on"), "{err}");
        // A dialect the app has no migrations for applies none.
        assert!(matches!(app.for_dialect(Dialect::Postgres), Ok(None)));
    }
}

//! Statements against the database: `Db` (dispatch, DDL, inserts, COPY, SHOW), DataFusion
//! queries, the `pg_catalog` tables and cluster mode's catalog following.

pub mod cluster;
pub mod db;
pub mod history;
pub mod pg_catalog;
pub mod query;

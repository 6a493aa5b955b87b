//! What a connection runs once it is in: pgwire's handlers (`pg`), prepared statements,
//! result cells, COPY, continuous queries and the session's settings.

pub mod cells;
pub mod copy;
pub mod deferred;
pub mod pg;
pub mod prepared;
pub mod settings;
pub mod subscribe;

//! Integration test: runs every .slt file under `sqllogic-tests/slt/` against the Eddy server at `$EDDY_PG_ADDR`.

use std::path::Path;

use eddy_sqllogictest::{collect_slt_files, run_files, summary, Mode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slt_files_pass() {
    let addr = match std::env::var("EDDY_PG_ADDR") {
        Ok(addr) if !addr.trim().is_empty() => addr,
        _ => panic!(
            "EDDY_PG_ADDR is not set: start an Eddy server and set EDDY_PG_ADDR=127.0.0.1:PORT \
             (its PostgreSQL endpoint) to run the sqllogictest files; this test never skips"
        ),
    };

    // Read at run time: a test binary built from another checkout sharing the target
    // directory would carry that checkout's path.
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let crate_dir = crate_dir.as_path();
    let slt_dir = crate_dir.join("slt");
    let files = collect_slt_files(std::slice::from_ref(&slt_dir))
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", slt_dir.display()));
    assert!(
        !files.is_empty(),
        "no .slt files found under {}",
        slt_dir.display()
    );

    let shown = |path: &Path| path.strip_prefix(crate_dir).unwrap_or(path).to_path_buf();
    let outcomes = run_files(&addr, &files, Mode::Check, |outcome| {
        println!("{}", outcome.report(&shown(&outcome.path)));
    })
    .await;
    println!("slt: {}", summary(&outcomes));

    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| o.report(&shown(&o.path)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} .slt files failed against {addr}:\n{}",
        failed.len(),
        outcomes.len(),
        failed.join("\n")
    );
}

//! Scenarios of processes that outlive a run: after SIGKILL and a restart, or SIGTERM, nothing
//! the old run started remains (issue 10, point 3).

//! Scenarios of secrets the agent could read: host secrets and the model key are absent from
//! every `/proc/*/environ`, `/proc/*/cmdline` and file the agent's user can read (issue 10,
//! point 4).

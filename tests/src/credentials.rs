//! Scenarios of the credential proxy: the CLI talks to the runner's loopback proxy with a
//! per-session token; only the proxy holds the real model key (issue 10, point 4).

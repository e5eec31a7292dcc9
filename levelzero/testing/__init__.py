"""Test doubles and helpers shared by the tests, the simulation and the benchmarks: a throwaway
PostgreSQL server, a moto S3 server, a free-port picker, an object store with injected faults.
Shipped with the package (the demo and the benchmarks use them), never imported by core or actors."""

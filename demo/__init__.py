"""The demo: the worm-response scenario, synthetic incident traffic and a simulated
fleet, for `./run`, the benchmarks and the tests. Nothing of the service depends on it."""

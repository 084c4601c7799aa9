"""The operators' pages, one module per area. Views stay thin: reads come from
broker.reads (and reports.reads), writes from broker.services."""

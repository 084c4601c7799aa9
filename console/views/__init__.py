"""The operators' pages, one module per area. Views stay thin: reads come from
selectors (broker.selectors, broker.search), writes from broker.services."""

"""The scenario: its schema and loader, command-line overrides, and the GPU batch budgets each
policy is given."""

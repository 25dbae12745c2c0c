"""Reading a campaign: Pareto maths (``pareto``), results tables (``results``), the report (``report``). Loads
neither Ray nor torch."""

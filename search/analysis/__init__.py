"""Reading a campaign: Pareto maths (``pareto``), results tables (``results``), the report's front computed
once (``front``), its figures (``figures``) and the report itself (``report``). Loads neither Ray nor torch."""

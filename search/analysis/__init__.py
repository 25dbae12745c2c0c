"""Reading a campaign: Pareto maths (``pareto``), results tables (``results``), the report's front computed
once (``front``), its figures (``figures``), what a design is worth at equal cost (``effects``), which searched key
mattered (``importance``), the paper-style table (``paper_table``), the report itself (``report``) and several
campaigns side by side (``compare``). Loads neither Ray nor torch."""

"""The results report a person looks at: ``nslab report RESULTS.json --html OUT``
(``report.page``: the page; ``report.figures``: its plotly plots)."""

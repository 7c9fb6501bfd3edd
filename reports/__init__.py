"""The static HTML report over the result warehouse (``matrun report``) and the page of
``matrun compare --html``.

Modules:

- ``data``: reads the warehouse's views into Polars DataFrames (the only module that runs SQL);
- ``shape``: labels, summarises and masks those DataFrames;
- ``figures``: Plotly figures from DataFrames, and the helpers every figure shares
  (``base_layout``, ``legend_below``, ``empty_figure``); ``study_figures``: those of the
  study pages;
- ``pages``: HTML escaping and building blocks, page templates, writing the site atomically;
- ``sections`` / ``study_sections``: the HTML of each page's sections (``sections`` also
  holds the number formatting both use);
- ``site``: which pages exist, what each shows, their CSV files (pure: no I/O);
- ``build``: ``build_report(warehouse=..., out_dir=..., publish=False)``, the library twin of
  ``matrun report``: read, shape, draw, write;
- ``compare``: the self-contained HTML page of a ``matrun.warehouse.compare.Comparison``.

May import ``matrun.errors`` and ``matrun.warehouse`` (``warehouse.db`` to open the
warehouse read-only, ``warehouse.compare`` for the comparison it renders,
``warehouse.bundles.layout`` for the run statuses); never ``matrun.runner``.  Nothing in
``matrun.warehouse`` imports this package.
"""

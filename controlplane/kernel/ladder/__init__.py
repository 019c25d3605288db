"""The degradation ladder: its rungs as data (``model``), the file that declares them
(``file``) and what a region has switched off now (``record``)."""

"""One module per family, each starting "Same as X, except: ...". `registry` imports every module
here and registers the `FAMILY` it defines: adding a family is adding its module."""

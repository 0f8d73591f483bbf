"""Process supervision (private): ``distcomm run``'s supervisor, the worker processes of
``distcomm.testing.spawn`` and flame's ``run_local``, and the variables that make a rank."""

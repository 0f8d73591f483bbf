"""Plugin loading (private): the pluggy/entry-point loader, the core's own plugins, and the
names of the first-party backends."""

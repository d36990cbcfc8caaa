"""Training DFlash block drafters on data written by `blockdraft gen-data`."""

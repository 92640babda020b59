"""Pure: a typed cost model and a discrete-event simulator of any valid schedule."""

"""popdist: the PopDist API."""

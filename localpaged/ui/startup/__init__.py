"""The page shown while the app starts (view.py), served by localpaged.api.loading's gate."""

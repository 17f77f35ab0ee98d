extra = openonce.load_capabilities_file("openonce-providers.json")
rec = openonce.Reconciler(oo.store, extra_capabilities=extra)
rec.register("slack.post_message", slack_prober, capability="slack_metadata")

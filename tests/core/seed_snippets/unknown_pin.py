rec.register("email.send", gmail_prober, capability="email_provider_api")

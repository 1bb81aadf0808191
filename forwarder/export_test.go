package forwarder

// SetAfterPublishHook makes every pass call fn after publishing and before marking; an error from
// fn aborts the pass there, as a crash would.
func SetAfterPublishHook(f *Forwarder, fn func() error) { f.hooks.afterPublish = fn }

// SetBeforePublishHook makes every pass call fn after claiming its rows and before publishing any;
// an error from fn aborts the pass there, as a relay dying at that point would.
func SetBeforePublishHook(f *Forwarder, fn func() error) { f.hooks.beforePublish = fn }

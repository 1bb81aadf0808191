package forwarder

// SetAfterPublishHook makes every pass call fn after publishing and before marking; an error from
// fn aborts the pass there, as a crash would.
func SetAfterPublishHook(f *Forwarder, fn func() error) { f.hooks.afterPublish = fn }

package redistest

// AddUser creates the ACL user name with password (ACL SETUSER name reset
// on >password rules..., or nopass when password is empty), replacing any
// user of that name, and returns a view of the server whose Do
// authenticates as that user (see As). The rules are ACL SETUSER's, e.g.
// "~rl:*", "+evalsha", "+ping". It fails the test when Redis refuses them.
func (s *Server) AddUser(name, password string, rules ...string) *Server {
	s.p.t.Helper()
	pass := "nopass"
	if password != "" {
		pass = ">" + password
	}
	s.MustDo(append([]string{"ACL", "SETUSER", name, "reset", "on", pass}, rules...)...)
	return s.As(name, password)
}

// Package envoygateway checks fleetlimit's Envoy Gateway snippet against
// Envoy Gateway itself: its tests decode the snippet with Envoy Gateway's
// own API types, strictly, and apply its Deployment patch as Envoy Gateway
// applies it. It is a module of its own, so that Envoy Gateway's and
// Kubernetes' packages stay out of the plugin's go.mod.
package envoygateway

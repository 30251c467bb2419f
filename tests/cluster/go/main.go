//go:debug default=go1.26

// kubeairunway-apiserver is the Kubernetes API server of kubeairunway's integration tests:
// one process that serves, from etcd, with the upstream code kube-apiserver is built from
// (k8s.io/apiserver, k8s.io/apiextensions-apiserver, k8s.io/api as Debian packages them):
//
//   - CustomResourceDefinitions and custom resources (k8s.io/apiextensions-apiserver:
//     structural schemas, CEL validation, defaulting, status and scale subresources,
//     conversion webhooks);
//   - the built-in kinds the platform uses (builtin.go): core/v1 namespaces, pods,
//     secrets, configmaps, services, nodes, events, serviceaccounts,
//     persistentvolumeclaims, persistentvolumes; apps/v1 deployments, daemonsets,
//     statefulsets, replicasets; batch/v1 jobs; coordination.k8s.io/v1 leases;
//     events.k8s.io/v1 events; admissionregistration.k8s.io/v1 validating and mutating
//     webhook configurations, validatingadmissionpolicies (with their status subresource)
//     and validatingadmissionpolicybindings; discovery.k8s.io/v1 endpointslices;
//     rbac.authorization.k8s.io/v1 roles, rolebindings, clusterroles, clusterrolebindings;
//     autoscaling/v2 horizontalpodautoscalers; policy/v1 poddisruptionbudgets. Each through
//     the generic registry with the k8s.io/api Go types, status subresources,
//     strategic-merge patch (from the Go types' patch tags), server-side apply (OpenAPI definitions generated at build time by
//     openapi-gen over k8s.io/api, so lists merge by their real keys), watches, and the
//     field selectors kube-apiserver offers for those kinds;
//   - kube-apiserver's admission chain for all of them: NamespaceLifecycle,
//     MutatingAdmissionWebhook, ValidatingAdmissionPolicy and ValidatingAdmissionWebhook,
//     reading the served webhook configurations, policies and bindings (the policy plugin
//     is k8s.io/apiserver's, wired as kube-apiserver wires it: CEL over the request, the
//     objects and the `authorizer` variable, which asks this server's authorizer). A
//     webhook's service reference resolves the way kube-apiserver does with
//     --enable-aggregator-routing: Service port -> EndpointSlice
//     (k8s.io/apiserver/pkg/util/proxy.ResolveEndpoint), so a test that serves a webhook
//     on 127.0.0.1:<port> writes the Service and an EndpointSlice pointing there, playing
//     the EndpointSlice controller. TLS is verified against the caBundle with the server
//     name <service>.<namespace>.svc, as kube-apiserver does;
//   - RBAC authorization as kube-apiserver's --authorization-mode=RBAC does it (rbac.go):
//     system:masters always allowed, then the rules of the Roles and ClusterRoles bound to
//     the user or its groups; writes of Roles and bindings that would grant permissions
//     their author does not hold are forbidden; the bootstrap ClusterRoles for discovery and
//     cluster-admin exist. authorization.k8s.io/v1 SubjectAccessReview,
//     LocalSubjectAccessReview and SelfSubjectAccessReview are answered by the same
//     authorizer (sar.go); authentication.k8s.io/v1 SelfSubjectReview answers who the
//     requester is (selfreview.go). --authorization-mode=AlwaysAllow allows every request;
//   - audit logging (--audit-log-path, --audit-policy-file), so tests can see which user
//     made which request.
//
// What it does not do, compared with kube-apiserver:
//   - no validation and no defaulting of built-in kinds: both live in k8s.io/kubernetes
//     (pkg/apis/*/validation, pkg/apis/*/v1/defaults.go), which Debian does not package;
//     a Pod without containers is stored as sent. Object metadata is validated. The
//     exceptions are what admission and routing read (defaults.go) and a Secret's
//     stringData merged into data (builtin.go);
//   - x509 client certificates and anonymous requests authenticate, and a stand-in for
//     bound service-account tokens (tokens.go: opaque tokens listed in
//     --bound-service-account-tokens-file, each the service account of a pod with the
//     pod and its node in the user's extra, as kube-apiserver gives a bound token's
//     bearer); no signed service-account tokens, no TokenRequest, no other tokens; no Node
//     authorizer, no ClusterRole aggregation (a kube-controller-manager controller), no
//     SelfSubjectRulesReview;
//   - no controllers, kubelet or scheduler: nothing runs pods, schedules them, fills Job,
//     Deployment or Node status, garbage-collects owned objects or empties a terminating
//     namespace. Tests write those statuses themselves, as envtest users do;
//   - core/v1 and events.k8s.io/v1 Events are stored apart (kube-apiserver converts one
//     into the other); no other built-in kinds, no scale subresources of built-in kinds, no
//     aggregation, no API priority and fairness, no MutatingAdmissionPolicy. Admission
//     policies and bindings are stored as sent, defaults aside (kube-apiserver's validation
//     of them, and its check that their author may read the paramKind, live in
//     k8s.io/kubernetes), and nothing writes a policy's status.typeChecking (a
//     kube-controller-manager controller).
package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"sync"
	"time"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"

	builtinopenapi "kubeairunway/apiserver/builtinopenapi"

	"github.com/spf13/cobra"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apihelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	crdv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver"
	"k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	generatedopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/version"
	k8sadmission "k8s.io/apiserver/pkg/admission"
	admissioninit "k8s.io/apiserver/pkg/admission/initializer"
	mutatingpolicy "k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	webhookinit "k8s.io/apiserver/pkg/admission/plugin/webhook/initializer"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/union"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/apiserver/pkg/util/openapi"
	"k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/dynamic"
	clientgoinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/cli"
	"k8s.io/klog/v2"
	"k8s.io/kube-openapi/pkg/common"
	netutils "k8s.io/utils/net"
)

func main() {
	opts := options.NewCustomResourceDefinitionsServerOptions(os.Stdout, os.Stderr)
	rec := opts.RecommendedOptions
	rec.CoreAPI = nil
	// Admission is applied in serve, once the loopback client it reads through exists.
	rec.Admission = nil
	admission := genericoptions.NewAdmissionOptions()
	// kube-apiserver's default chain less MutatingAdmissionPolicy (whose kinds are not
	// served), in kube-apiserver's order (pkg/kubeapiserver/options/plugins.go of Kubernetes
	// v1.36, AllOrderedPlugins): NamespaceLifecycle, MutatingAdmissionWebhook, then the
	// validating ValidatingAdmissionPolicy and ValidatingAdmissionWebhook.
	admission.DefaultOffPlugins = sets.New(mutatingpolicy.PluginName)
	rec.Features.EnablePriorityAndFairness = false
	rec.Authentication.RemoteKubeConfigFileOptional = true
	rec.Authentication.SkipInClusterLookup = true
	rec.Authorization.RemoteKubeConfigFileOptional = true
	rec.SecureServing.BindAddress = netutils.ParseIPSloppy("127.0.0.1")

	authorizationMode := modeRBAC
	boundTokensFile := ""
	cmd := &cobra.Command{
		Use:   "kubeairunway-apiserver",
		Short: "Kubernetes API server (CRDs, the built-in kinds kubeairunway uses, webhook admission) for kubeairunway's integration tests",
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return opts.ServerRunOptions.ComponentGlobalsRegistry.Set()
		},
		RunE: func(c *cobra.Command, _ []string) error {
			if err := opts.Complete(); err != nil {
				return err
			}
			if err := opts.Validate(); err != nil {
				return err
			}
			if errs := admission.Validate(); len(errs) > 0 {
				return errs[0]
			}
			if authorizationMode != modeRBAC && authorizationMode != modeAlwaysAllow {
				return fmt.Errorf("--authorization-mode: %q is neither %s nor %s", authorizationMode, modeRBAC, modeAlwaysAllow)
			}
			return serve(c, opts, admission, authorizationMode, boundTokensFile)
		},
	}
	cmd.SetContext(genericapiserver.SetupSignalContext())
	opts.AddFlags(cmd.Flags())
	// --admission-control-config-file among them: a WebhookAdmissionConfiguration's
	// kubeConfigFile gives the API server the credentials it presents to webhooks.
	admission.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&authorizationMode, "authorization-mode", modeRBAC,
		"RBAC: authorize requests by the served RBAC objects, as kube-apiserver's RBAC mode does "+
			"(system:masters is always allowed); AlwaysAllow: authorize every request")
	cmd.Flags().StringVar(&boundTokensFile, "bound-service-account-tokens-file", "",
		"a stand-in for bound service-account tokens: a CSV file of lines "+
			"token,namespace,service account,pod name,pod UID,node name,node UID (tokens.go)")
	os.Exit(cli.Run(cmd))
}

// The values of --authorization-mode.
const (
	modeRBAC        = "RBAC"
	modeAlwaysAllow = "AlwaysAllow"
)

func serve(c *cobra.Command, opts *options.CustomResourceDefinitionsServerOptions, admission *genericoptions.AdmissionOptions,
	authorizationMode, boundTokensFile string) error {
	rec := opts.RecommendedOptions
	if err := rec.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return fmt.Errorf("self-signed certificates: %w", err)
	}
	cfg := genericapiserver.NewRecommendedConfig(apiserver.Codecs)
	if err := opts.ServerRunOptions.ApplyTo(&cfg.Config); err != nil {
		return err
	}
	// Serving and the loopback certificate, with ECDSA keys (loopback.go); ApplyTo would
	// generate RSA ones.
	secure := rec.SecureServing
	rec.SecureServing = nil
	if err := applySecureServing(secure, &cfg.Config); err != nil {
		return err
	}
	if err := rec.ApplyTo(cfg); err != nil {
		return err
	}
	if boundTokensFile != "" {
		addBoundTokens(&cfg.Authentication, boundTokensFile)
	}
	if err := opts.APIEnablement.ApplyTo(&cfg.Config, apiserver.DefaultAPIResourceConfigSource(), apiserver.Scheme); err != nil {
		return err
	}
	defs := openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(func(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
		all := generatedopenapi.GetOpenAPIDefinitions(ref)
		for name, def := range builtinopenapi.GetOpenAPIDefinitions(ref) {
			all[name] = def
		}
		return all
	})
	namer := openapinamer.NewDefinitionNamer(apiserver.Scheme, scheme.Scheme, Scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(defs, namer)
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(defs, namer)
	cfg.OpenAPIConfig.Info.Title = "kubeairunway-apiserver"
	cfg.OpenAPIV3Config.Info.Title = "kubeairunway-apiserver"

	// Admission reads Namespaces, webhook configurations, Services and EndpointSlices from
	// this server itself through its loopback client, as kube-apiserver does.
	loopback := cfg.LoopbackClientConfig
	client, err := kubernetes.NewForConfig(loopback)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(loopback)
	if err != nil {
		return err
	}
	informers := clientgoinformers.NewSharedInformerFactory(client, 10*time.Minute)
	cfg.SharedInformerFactory = informers
	// Authorization as kube-apiserver's --authorization-mode=RBAC: system:masters first
	// (pkg/kubeapiserver/authorizer/config.go), then RBAC over the served objects, read
	// through informers (rbac.go). The server's own loopback requests are allowed by the
	// generic server (AuthorizeClientBearerToken).
	var rbacRoles *informerRoles
	if authorizationMode == modeRBAC {
		rbac := informers.Rbac().V1()
		rbacRoles = &informerRoles{roles: rbac.Roles(), roleBindings: rbac.RoleBindings(),
			clusterRoles: rbac.ClusterRoles(), clusterRoleBindings: rbac.ClusterRoleBindings()}
		rbacRoles.hasSynced() // registers the informers before the factory starts
		cfg.Authorization.Authorizer = union.New(authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup),
			rbacAuthorizer{resolver: ruleResolver{source: rbacRoles}})
	} else {
		cfg.Authorization.Authorizer = authorizerfactory.NewAlwaysAllowAuthorizer()
	}
	cfg.ClientConfig = loopback
	slices, err := proxy.NewEndpointSliceIndexerGetter(informers.Discovery().V1().EndpointSlices())
	if err != nil {
		return err
	}
	resolver := &endpointResolver{services: informers.Core().V1().Services().Lister(), slices: slices}
	authWrapper := webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, loopback, noopoteltrace.NewTracerProvider())
	// The generic initializer of ApplyTo hands the ValidatingAdmissionPolicy plugin what it
	// needs: the loopback clients, the informer factory (policies, bindings, namespaces), a
	// REST mapper over discovery, and the authorizer behind its CEL `authorizer` variable.
	if err := admission.ApplyTo(&cfg.Config, informers, client, dyn, utilfeature.DefaultFeatureGate, cfg.EffectiveVersion,
		webhookinit.NewPluginInitializer(authWrapper, resolver), excludedFromPolicies{}); err != nil {
		return err
	}

	full := (&apiserver.Config{
		GenericConfig: cfg,
		ExtraConfig: apiserver.ExtraConfig{
			CRDRESTOptionsGetter: options.NewCRDRESTOptionsGetter(*rec.Etcd, cfg.ResourceTransformers, cfg.StorageObjectCountTracker),
			ServiceResolver:      resolver,
			AuthResolverWrapper:  authWrapper,
		},
	}).Complete()
	// Upstream leaves root discovery to kube-apiserver's aggregator, which is absent here.
	full.GenericConfig.EnableDiscovery = true
	server, err := full.New(genericapiserver.NewEmptyDelegate())
	if err != nil {
		return err
	}
	if err := installBuiltins(server.GenericAPIServer, *rec.Etcd, cfg); err != nil {
		return err
	}
	if err := addRBACHooks(server.GenericAPIServer, rbacRoles); err != nil {
		return err
	}

	crds := server.Informers.Apiextensions().V1().CustomResourceDefinitions()
	groups := &discoveredGroups{manager: server.GenericAPIServer.DiscoveryGroupManager, known: map[string]bool{}}
	sync := func() { groups.sync(crds.Lister().List(labels.Everything())) }
	if _, err := crds.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(interface{}) { sync() },
		UpdateFunc: func(interface{}, interface{}) { sync() },
		DeleteFunc: func(interface{}) { sync() },
	}); err != nil {
		return err
	}
	return server.GenericAPIServer.PrepareRun().RunWithContext(c.Context())
}

// installBuiltins installs the built-in API groups (builtin.go) on the server, stored in
// etcd as JSON of their v1 version, and creates the namespaces kube-apiserver's
// system-namespaces controller creates.
func installBuiltins(s *genericapiserver.GenericAPIServer, etcd genericoptions.EtcdOptions, cfg *genericapiserver.RecommendedConfig) error {
	var versions []schema.GroupVersion
	for _, r := range builtinResources {
		versions = append(versions, r.gv)
	}
	etcd.StorageConfig.Codec = Codecs.LegacyCodec(versions...)
	etcd.StorageConfig.StorageObjectCountTracker = cfg.StorageObjectCountTracker
	getter := etcd.CreateRESTOptionsGetter(&genericoptions.SimpleStorageFactory{StorageConfig: etcd.StorageConfig}, cfg.ResourceTransformers)
	core, named, err := builtinGroups(getter, cfg.Authorization.Authorizer)
	if err != nil {
		return err
	}
	if err := s.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, core); err != nil {
		return err
	}
	if err := s.InstallAPIGroups(named...); err != nil {
		return err
	}
	return s.AddPostStartHook("kubeairunway-system-namespaces", func(hook genericapiserver.PostStartHookContext) error {
		client, err := kubernetes.NewForConfig(hook.LoopbackClientConfig)
		if err != nil {
			return err
		}
		// A short interval: /readyz waits for this hook (NamespaceLifecycle refuses until its informer syncs).
		return wait.PollUntilContextCancel(hook, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			for _, name := range []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease} {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
				if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					klog.V(2).InfoS("creating a system namespace", "namespace", name, "err", err)
					return false, nil
				}
			}
			return true, nil
		})
	})
}

// excludedFromPolicies keeps the admission policies off the access reviews, which are
// never stored, as kube-apiserver does (pkg/kubeapiserver/admission/exclusion/resources.go
// of Kubernetes v1.36 lists them; this server serves those of authorization.k8s.io and
// SelfSubjectReview).
type excludedFromPolicies struct{}

func (excludedFromPolicies) Initialize(plugin k8sadmission.Interface) {
	if p, ok := plugin.(admissioninit.WantsExcludedAdmissionResources); ok {
		var reviews []schema.GroupResource
		for _, r := range []string{"subjectaccessreviews", "localsubjectaccessreviews", "selfsubjectaccessreviews"} {
			reviews = append(reviews, authorizationv1.Resource(r))
		}
		reviews = append(reviews, schema.GroupResource{Group: "authentication.k8s.io", Resource: "selfsubjectreviews"})
		p.SetExcludedAdmissionResources(reviews)
	}
}

// endpointResolver resolves a webhook's service reference to an endpoint of the Service,
// as kube-apiserver does with --enable-aggregator-routing.
type endpointResolver struct {
	services corelisters.ServiceLister
	slices   proxy.EndpointSliceGetter
}

func (r *endpointResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return proxy.ResolveEndpoint(r.services, r.slices, namespace, name, port)
}

// discoveredGroups keeps /apis in step with the served versions of established CRDs.
type discoveredGroups struct {
	mu      sync.Mutex
	manager interface {
		AddGroup(metav1.APIGroup)
		RemoveGroup(string)
	}
	known map[string]bool
}

func (d *discoveredGroups) sync(list []*crdv1.CustomResourceDefinition, err error) {
	if err != nil {
		klog.ErrorS(err, "listing CRDs for discovery")
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	served := map[string]map[string]bool{}
	for _, crd := range list {
		if !apihelpers.IsCRDConditionTrue(crd, crdv1.Established) || isBuiltinGroup(crd.Spec.Group) {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			if served[crd.Spec.Group] == nil {
				served[crd.Spec.Group] = map[string]bool{}
			}
			served[crd.Spec.Group][v.Name] = true
		}
	}
	for group, versions := range served {
		var list []metav1.GroupVersionForDiscovery
		for v := range versions {
			list = append(list, metav1.GroupVersionForDiscovery{GroupVersion: group + "/" + v, Version: v})
		}
		sort.Slice(list, func(i, j int) bool {
			return version.CompareKubeAwareVersionStrings(list[i].Version, list[j].Version) > 0
		})
		d.manager.AddGroup(metav1.APIGroup{Name: group, Versions: list, PreferredVersion: list[0]})
		d.known[group] = true
	}
	for group := range d.known {
		if served[group] == nil {
			d.manager.RemoveGroup(group)
			delete(d.known, group)
		}
	}
}
